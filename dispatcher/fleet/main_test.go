package fleet

import (
	"testing"

	"go.uber.org/goleak"
)

// Every Gate a test builds is closed, and Close must stop every goroutine
// the Gate and its go-redis client started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
