package tokenfile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// DefaultInterval is how often a Follower stats its file by default.
const DefaultInterval = time.Second

// Errors of a poll; Poll wraps them with the path.
var (
	// ErrEmpty: the file holds only whitespace.
	ErrEmpty = errors.New("the token file is empty")
	// ErrInvalidOptions wraps what New refuses.
	ErrInvalidOptions = errors.New("invalid token file options")
)

// Options configure a Follower.
type Options struct {
	// Path of the token file; surrounding whitespace of its content is
	// not part of the token.
	Path string
	// Grace is how long a replaced token is still accepted, in [0,
	// MaxGrace].
	Grace time.Duration
	// Interval between two stats of the file (default DefaultInterval).
	Interval time.Duration
	// Clock drives the polls and the grace (default the real clock).
	Clock clock.Clock
	// Log hears rotations and errors (each distinct error once); never a
	// token.
	Log logr.Logger
	// Polled, when set (tests), hears each poll's outcome from Run once
	// the next poll's timer is armed, and a zero outcome once the first
	// one is.
	Polled func(changed bool, err error)
}

// Follower is a token file followed on a clock.
type Follower struct {
	opts Options
	// pollMu serialises polls, so a slow poll that read the file before a
	// swap cannot overwrite a newer token a concurrent poll read after.
	pollMu sync.Mutex

	mu      sync.Mutex
	ring    Keyring
	seen    os.FileInfo // the file last read whole; nil forces a read
	lastErr string
}

// New returns a Follower of o.Path; nothing is read until Poll or Run.
func New(o Options) (*Follower, error) {
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	switch {
	case o.Path == "":
		return nil, fmt.Errorf("%w: no path", ErrInvalidOptions)
	case o.Grace < 0 || o.Grace > MaxGrace:
		return nil, fmt.Errorf("%w: grace %s must be between 0s and %s", ErrInvalidOptions, o.Grace, MaxGrace)
	case o.Interval < 0:
		return nil, fmt.Errorf("%w: interval %s must be positive", ErrInvalidOptions, o.Interval)
	}
	return &Follower{opts: o}, nil
}

// Path is the followed file.
func (f *Follower) Path() string { return f.opts.Path }

// Poll stats the file and, when the file behind the path changed since the
// last read (another inode, size or modification time: a swapped "..data"
// symlink or a rewrite), reads it. A new token becomes current; the
// replaced one enters its grace. changed is false when the content is the
// current token. On an error the tokens stay as they were.
func (f *Follower) Poll() (changed bool, err error) {
	f.pollMu.Lock()
	defer f.pollMu.Unlock()
	fi, err := os.Stat(f.opts.Path)
	if err != nil {
		return false, fmt.Errorf("token file: %w", err)
	}
	f.mu.Lock()
	same := f.seen != nil && sameFile(f.seen, fi)
	f.mu.Unlock()
	if same {
		return false, nil
	}
	b, err := os.ReadFile(f.opts.Path)
	if err != nil {
		return false, fmt.Errorf("token file: %w", err)
	}
	tok := bytes.TrimSpace(b)
	if len(tok) == 0 {
		return false, fmt.Errorf("%w: %s", ErrEmpty, f.opts.Path)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// A swap between the stat and the read is caught by the next poll:
	// its stat differs from fi, and a re-read of the same token changes
	// nothing.
	f.seen = fi
	return f.ring.Rotate(tok, f.opts.Clock.Now(), f.opts.Grace), nil
}

func sameFile(a, b os.FileInfo) bool {
	return os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}

// Verify reports whether tok is the current token or the replaced one
// within its grace, in constant time.
func (f *Follower) Verify(tok []byte) bool {
	now := f.opts.Clock.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ring.Match(tok, now)
}

// Tokens are the current token ("" before a successful read) and the
// replaced one while its grace lasts ("" otherwise).
func (f *Follower) Tokens() (cur, prev string) {
	now := f.opts.Clock.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	c, p := f.ring.Tokens(now)
	return string(c), string(p)
}

// Run polls every Interval until ctx ends, logging each rotation and each
// new error once.
func (f *Follower) Run(ctx context.Context) {
	t := f.opts.Clock.NewTimer(f.opts.Interval)
	defer t.Stop()
	f.report(false, nil)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		changed, err := f.Poll()
		t.Reset(f.opts.Interval)
		f.logOutcome(changed, err)
		f.report(changed, err)
	}
}

func (f *Follower) logOutcome(changed bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	log := f.opts.Log.WithValues("file", f.opts.Path)
	switch {
	case err != nil:
		if msg := err.Error(); msg != f.lastErr {
			f.lastErr = msg
			log.Error(err, "keeping the token read before")
		}
		return
	case changed:
		log.Info("token file changed: the new token is in force", "previousAcceptedUntil", f.ring.GraceEnds().UTC().Format(time.RFC3339))
	}
	f.lastErr = ""
}

func (f *Follower) report(changed bool, err error) {
	if f.opts.Polled != nil {
		f.opts.Polled(changed, err)
	}
}
