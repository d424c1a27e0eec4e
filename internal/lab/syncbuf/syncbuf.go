// Package syncbuf is a bytes.Buffer that goroutines may write while a test
// reads it: a logger's output, a child process's, a server's handlers'.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is safe for concurrent writes and reads. The zero value is empty
// and ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
