package dispatcher

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"time"

	"github.com/tiergate/tiergate/dispatcher/policy"
)

// loadFile reads, validates and applies the policy file. last, when not
// nil, is the hash of the content applied before: an unchanged file is
// skipped, and the new hash is stored there.
func (d *Dispatcher) loadFile(last *[sha256.Size]byte) error {
	data, err := os.ReadFile(d.cfg.PolicyFile)
	if err != nil {
		return fmt.Errorf("policy file: %w", err)
	}
	sum := sha256.Sum256(data)
	if last != nil {
		if bytes.Equal(sum[:], last[:]) {
			return nil
		}
		// Remember even a bad edit, so it is reported once, not every tick.
		*last = sum
	}
	p, err := policy.DecodeAndValidate(data)
	if err != nil {
		return fmt.Errorf("policy file %s: %w", d.cfg.PolicyFile, err)
	}
	if _, err := d.Apply(p); err != nil {
		return fmt.Errorf("policy file %s: %w", d.cfg.PolicyFile, err)
	}
	return nil
}

// watchFile re-reads the policy file every PolicyPollInterval and applies
// it when its content changed. A bad edit keeps the previous policy and
// is logged. Polling the content (rather than inotify) also follows the
// symlink swaps of a Kubernetes ConfigMap volume.
func (d *Dispatcher) watchFile(ctx context.Context) {
	log := d.cfg.Log.WithValues("file", d.cfg.PolicyFile)
	var last [sha256.Size]byte
	if data, err := os.ReadFile(d.cfg.PolicyFile); err == nil {
		last = sha256.Sum256(data)
	}
	t := time.NewTicker(d.cfg.PolicyPollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			before := last
			if err := d.loadFile(&last); err != nil {
				log.Error(err, "keeping the previous policy")
			} else if last != before {
				log.Info("policy file changed and was applied")
			}
		}
	}
}
