package dispatcher

import (
	"context"
	"slices"

	"github.com/sidefx/sidefx/effects"
)

// pauseSet is what operators paused (sidefx pause): kinds, and providers
// whose every kind is held back.
type pauseSet struct {
	kinds, providers map[string]bool
}

// refreshPauses reads the pauses, and logs what changed. On an error the
// last reading stays.
func (d *Dispatcher) refreshPauses(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
	defer cancel()
	ps, err := d.store.Pauses(pctx)
	if err != nil {
		switch {
		case ctx.Err() != nil:
		case d.paused.Load() == nil:
			d.log.Warn("reading the pauses failed; claiming nothing until a reading succeeds (tried again each heartbeat)", "err", err)
		default:
			d.log.Warn("reading the pauses failed; keeping the last reading", "err", err)
		}
		return
	}
	next := &pauseSet{kinds: map[string]bool{}, providers: map[string]bool{}}
	for _, p := range ps {
		switch p.Scope {
		case effects.PauseKind:
			next.kinds[p.Name] = true
		case effects.PauseProvider:
			next.providers[p.Name] = true
		}
	}
	prev := d.paused.Swap(next)
	for _, g := range d.groups {
		was, is := prev != nil && prev.providers[g.name], next.providers[g.name]
		switch {
		case is && !was:
			d.log.Warn("provider paused by an operator: none of its effects is claimed until it is resumed", "provider", g.name)
		case was && !is:
			d.log.Info("provider resumed", "provider", g.name)
		}
		for _, k := range g.kinds {
			was, is := prev != nil && prev.kinds[k], next.kinds[k]
			switch {
			case is && !was:
				d.log.Warn("kind paused by an operator: none of its effects is claimed until it is resumed", "kind", k)
			case was && !is:
				d.log.Info("kind resumed", "kind", k)
			}
		}
	}
	if prev == nil || !sameSet(prev, next) {
		signal(d.wake) // something resumed: its effects may be due
	}
}

func sameSet(a, b *pauseSet) bool {
	if len(a.kinds) != len(b.kinds) || len(a.providers) != len(b.providers) {
		return false
	}
	for k := range a.kinds {
		if !b.kinds[k] {
			return false
		}
	}
	for p := range a.providers {
		if !b.providers[p] {
			return false
		}
	}
	return true
}

// active returns g's kinds that are not paused, nor their provider; none
// before the pauses were first read: a pause must hold across a restart.
func (d *Dispatcher) active(g *group) []string {
	p := d.paused.Load()
	if p == nil {
		return nil
	}
	if len(p.kinds) == 0 && len(p.providers) == 0 {
		return g.kinds
	}
	if p.providers[g.name] {
		return nil
	}
	return slices.DeleteFunc(slices.Clone(g.kinds), func(k string) bool { return p.kinds[k] })
}

// activeServed returns the served kinds that are not paused; none before
// the pauses were first read.
func (d *Dispatcher) activeServed() []string {
	p := d.paused.Load()
	if p == nil {
		return nil
	}
	if len(p.kinds) == 0 && len(p.providers) == 0 {
		return d.served
	}
	var out []string
	for _, g := range d.groups {
		out = append(out, d.active(g)...)
	}
	return out
}
