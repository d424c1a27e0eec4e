package edge

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// listenLinger is how long the outcome listener keeps its connection after
// its last waiter left, so that a steady trickle of awaited requests does
// not open a connection each.
const listenLinger = 30 * time.Second

// listenRetry is how long after a failed LISTEN the next waiter tries again;
// meanwhile waiters poll.
const listenRetry = time.Second

// outcomeListener wakes the requests waiting for effects' outcomes when the
// dispatcher announces a settled effect on the outcome channel
// (dispatcher.Kind.NotifyOutcome). It holds one connection while anyone
// waits, and for listenLinger after; a request whose effect's kind is not
// announced, or that waits while the listener is down, finds its outcome by
// polling all the same.
type outcomeListener struct {
	pool    *pgxpool.Pool // nil: nothing is announced; waiters poll
	channel string

	mu       sync.Mutex
	waiters  map[int64]map[*waiter]bool
	count    int                // subscribed waiters
	running  bool               // the listening goroutine runs
	ready    bool               // and its LISTEN is active
	stop     context.CancelFunc // ends the listening goroutine
	idle     *time.Timer        // stops it after listenLinger without waiters
	failedAt time.Time          // its last failure
	closed   bool
}

// waiter is one request waiting for an effect.
type waiter struct {
	l    *outcomeListener
	id   int64         // the effect watched; 0 until known
	wake chan struct{} // signalled when it may have settled
}

func newOutcomeListener(pool *pgxpool.Pool, channel string) *outcomeListener {
	return &outcomeListener{pool: pool, channel: channel, waiters: map[int64]map[*waiter]bool{}}
}

// subscribe returns a waiter, starting the listener if none runs.
func (l *outcomeListener) subscribe() *waiter {
	w := &waiter{l: l, wake: make(chan struct{}, 1)}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.count++
	if l.idle != nil {
		l.idle.Stop()
		l.idle = nil
	}
	if l.pool != nil && !l.running && !l.closed && time.Since(l.failedAt) >= listenRetry {
		ctx, cancel := context.WithCancel(context.Background())
		l.running, l.stop = true, cancel
		go l.listen(ctx)
	}
	return w
}

// listening reports whether announcements reach waiters now.
func (l *outcomeListener) listening() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ready
}

// watch makes w wake when effect id is announced.
func (w *waiter) watch(id int64) {
	l := w.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.id == id {
		return
	}
	w.forgetLocked()
	w.id = id
	if l.waiters[id] == nil {
		l.waiters[id] = map[*waiter]bool{}
	}
	l.waiters[id][w] = true
}

func (w *waiter) forgetLocked() {
	if w.id == 0 {
		return
	}
	set := w.l.waiters[w.id]
	delete(set, w)
	if len(set) == 0 {
		delete(w.l.waiters, w.id)
	}
}

// done unsubscribes w; the listener stops after listenLinger without
// waiters.
func (w *waiter) done() {
	l := w.l
	l.mu.Lock()
	defer l.mu.Unlock()
	w.forgetLocked()
	l.count--
	if l.count == 0 && l.running && l.idle == nil {
		l.idle = time.AfterFunc(listenLinger, l.stopIfIdle)
	}
}

func (l *outcomeListener) stopIfIdle() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.count == 0 && l.stop != nil {
		l.stop()
	}
	l.idle = nil
}

// close stops the listener for good.
func (l *outcomeListener) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.idle != nil {
		l.idle.Stop()
		l.idle = nil
	}
	if l.stop != nil {
		l.stop()
	}
}

// wakeAllLocked signals every waiter: announcements may have been missed.
func (l *outcomeListener) wakeAllLocked() {
	for _, set := range l.waiters {
		for w := range set {
			signalWaiter(w)
		}
	}
}

func signalWaiter(w *waiter) {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// listen holds a connection of its own, LISTENs on the outcome channel and
// wakes the waiters of each announced effect, until ctx ends or the
// connection breaks.
func (l *outcomeListener) listen(ctx context.Context) {
	err := l.listenOn(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running, l.ready, l.stop = false, false, nil
	if err != nil && ctx.Err() == nil {
		l.failedAt = time.Now()
	}
}

func (l *outcomeListener) listenOn(ctx context.Context) error {
	pc, err := l.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Hijack() // the listener's until it stops
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn.Close(cctx) //nolint:errcheck // closing a connection we are done with
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize()); err != nil {
		return err
	}
	l.mu.Lock()
	l.ready = true
	l.wakeAllLocked() // announcements before the LISTEN were missed
	l.mu.Unlock()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		id, err := strconv.ParseInt(n.Payload, 10, 64)
		if err != nil {
			continue
		}
		l.mu.Lock()
		for w := range l.waiters[id] {
			signalWaiter(w)
		}
		l.mu.Unlock()
	}
}
