package server

import (
	"log"
	"strings"

	"github.com/go-logr/logr"
)

// logrWriter turns the standard logger net/http wants into logr.
type logrWriter struct{ log logr.Logger }

func (w logrWriter) Write(p []byte) (int, error) {
	w.log.Info(strings.TrimSpace(string(p)))
	return len(p), nil
}

// NewStdLogger adapts logr for the *log.Logger that net/http takes as
// ErrorLog, for the dispatcher's servers.
func NewStdLogger(l logr.Logger) *log.Logger { return log.New(logrWriter{l}, "", 0) }
