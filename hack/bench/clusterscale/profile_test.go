package clusterscale

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// profile takes a CPU profile of the controller over cfg.ProfileFor into
// cfg.Profile/name, from its net/http/pprof endpoint, and says on the
// channel when it is written; it sends nil at once when not profiling.
func (b *bench) profile(t *testing.T, name string) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	if b.cfg.Profile == "" {
		done <- nil
		return done
	}
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", b.ctrlPprof, int(b.cfg.ProfileFor/time.Second))
	path := filepath.Join(b.cfg.Profile, name)
	go func() { done <- fetchProfile(url, path, b.cfg.ProfileFor+30*time.Second) }()
	return done
}

// fetchProfile writes what url answers to path.
func fetchProfile(url, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
