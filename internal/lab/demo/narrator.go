package demo

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// narrator prints the story: timestamped lines, indented details, and a
// progress line that a terminal shows updated in place and anything else
// gets once a second.
type narrator struct {
	mu       sync.Mutex
	w        io.Writer
	start    time.Time
	terminal bool // progress in place, with \r
	quiet    bool // no progress at all
	onScreen bool // a progress line is on the terminal, unterminated
	lastLine time.Time
}

func newNarrator(w io.Writer, quiet bool) *narrator {
	return &narrator{w: w, start: time.Now(), terminal: isTerminal(w), quiet: quiet}
}

// isTerminal reports whether w is a character device, such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// elapsed is the time since the demo started, as the lines show it.
func (n *narrator) elapsed() time.Duration { return time.Since(n.start) }

// clearLocked takes a progress line off the terminal.
func (n *narrator) clearLocked() {
	if n.onScreen {
		fmt.Fprint(n.w, "\r\x1b[K")
		n.onScreen = false
	}
}

// say prints one line of the story, stamped with the time since the start.
func (n *narrator) say(format string, args ...any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.clearLocked()
	fmt.Fprintf(n.w, "[%5.1fs] %s\n", n.elapsed().Seconds(), fmt.Sprintf(format, args...))
}

// detail prints a line that belongs to the line said before it.
func (n *narrator) detail(format string, args ...any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.clearLocked()
	fmt.Fprintf(n.w, "         %s\n", fmt.Sprintf(format, args...))
}

// text prints lines as they are.
func (n *narrator) text(lines ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.clearLocked()
	for _, l := range lines {
		fmt.Fprintln(n.w, l)
	}
}

// progress shows line: in place on a terminal, else at most once a second.
func (n *narrator) progress(line string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.quiet {
		return
	}
	if n.terminal {
		fmt.Fprintf(n.w, "\r\x1b[K  %s", line)
		n.onScreen = true
		return
	}
	if now := time.Now(); now.Sub(n.lastLine) >= time.Second {
		n.lastLine = now
		fmt.Fprintf(n.w, "[%5.1fs]   %s\n", n.elapsed().Seconds(), line)
	}
}

// keep leaves the progress line on the terminal, as an ordinary line.
func (n *narrator) keep() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.onScreen {
		fmt.Fprintln(n.w)
		n.onScreen = false
	}
}

// table formats rows as columns, indented: the first column left-aligned,
// the others right-aligned if numeric is set, else left-aligned.
func table(indent string, rows [][]string, numeric bool) []string {
	var widths []int
	for _, r := range rows {
		for i, c := range r {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	out := make([]string, 0, len(rows))
	for _, r := range rows {
		var b strings.Builder
		b.WriteString(indent)
		for i, c := range r {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			switch {
			case i == 0:
				b.WriteString(c + pad)
			case numeric:
				b.WriteString("  " + pad + c)
			default:
				b.WriteString("  " + c + pad)
			}
		}
		out = append(out, strings.TrimRight(b.String(), " "))
	}
	return out
}
