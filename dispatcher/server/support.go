package server

import (
	"log"
	"strings"
	"sync"

	"github.com/go-logr/logr"
)

// bufferPool reuses the proxy's 32 KiB copy buffers.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *(copyBuffers.Get().(*[]byte)) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }

// logrWriter turns the standard logger httputil wants into logr.
type logrWriter struct{ log logr.Logger }

func (w logrWriter) Write(p []byte) (int, error) {
	w.log.Info(strings.TrimSpace(string(p)))
	return len(p), nil
}

// NewStdLogger adapts logr for the *log.Logger that net/http and httputil
// take as ErrorLog; the dispatcher's servers use it too.
func NewStdLogger(l logr.Logger) *log.Logger { return log.New(logrWriter{l}, "", 0) }
