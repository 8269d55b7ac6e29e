package dispatcher

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// loadFile reads, validates and applies the policy file. last, when not
// nil, is the hash of the content applied before: an unchanged file is
// skipped, and the new hash is stored there.
func (d *Dispatcher) loadFile(last *[sha256.Size]byte) error {
	_, err := loadPolicyFile(d.cfg.PolicyFile, last, d.Apply)
	return err
}

// loadPolicyFile is loadFile for any path and apply function; changed says
// whether the content differed from *last.
func loadPolicyFile(path string, last *[sha256.Size]byte, apply func(*policy.Policy) (policy.Ack, error)) (changed bool, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("policy file: %w", err)
	}
	sum := sha256.Sum256(data)
	if last != nil {
		if sum == *last {
			return false, nil
		}
		// Remember even a bad edit, so it is reported once, not every tick.
		*last = sum
	}
	p, err := policy.DecodeAndValidate(data)
	if err != nil {
		return true, fmt.Errorf("policy file %s: %w", path, err)
	}
	if _, err := apply(p); err != nil {
		return true, fmt.Errorf("policy file %s: %w", path, err)
	}
	return true, nil
}

// watchFile re-reads the policy file every PolicyPollInterval, on the
// dispatcher's clock, until ctx ends.
func (d *Dispatcher) watchFile(ctx context.Context) {
	w := &fileWatcher{
		path: d.cfg.PolicyFile, interval: d.cfg.PolicyPollInterval, clock: d.cfg.Clock,
		apply: d.Apply, log: d.cfg.Log.WithValues("file", d.cfg.PolicyFile),
	}
	w.run(ctx)
}

// fileWatcher applies the policy file whenever its content changes. A bad
// edit keeps the previous policy and is logged once. Polling the content
// (rather than inotify) also follows the symlink swaps of a Kubernetes
// ConfigMap volume.
type fileWatcher struct {
	path     string
	interval time.Duration
	clock    clock.Clock
	apply    func(*policy.Policy) (policy.Ack, error)
	log      logr.Logger
	// polled, when set (tests), hears each poll's outcome once the next
	// poll's timer is armed, and a zero outcome once the first one is.
	polled func(changed bool, err error)
}

// run polls until ctx ends. The content present when it starts counts as
// applied (Serve applied it).
func (w *fileWatcher) run(ctx context.Context) {
	var last [sha256.Size]byte
	if data, err := os.ReadFile(w.path); err == nil {
		last = sha256.Sum256(data)
	}
	t := w.clock.NewTimer(w.interval)
	defer t.Stop()
	w.report(false, nil)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		changed, err := loadPolicyFile(w.path, &last, w.apply)
		t.Reset(w.interval)
		switch {
		case err != nil:
			w.log.Error(err, "keeping the previous policy")
		case changed:
			w.log.Info("policy file changed and was applied")
		}
		w.report(changed, err)
	}
}

func (w *fileWatcher) report(changed bool, err error) {
	if w.polled != nil {
		w.polled(changed, err)
	}
}
