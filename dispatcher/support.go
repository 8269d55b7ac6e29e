package dispatcher

import (
	"log"
	"strings"

	"github.com/go-logr/logr"
)

type logrWriter struct{ log logr.Logger }

func (w logrWriter) Write(p []byte) (int, error) {
	w.log.Info(strings.TrimSpace(string(p)))
	return len(p), nil
}

// newStdLogger adapts logr for net/http's ErrorLog.
func newStdLogger(l logr.Logger) *log.Logger { return log.New(logrWriter{l}, "", 0) }
