package dispatcher

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/testutil"
)

// The dispatcher follows --admin-token-file as the kubelet swaps a Secret
// volume: each new token is accepted within seconds of the swap, the one
// it replaced until --admin-token-grace has passed since the dispatcher
// saw the swap, and refused after that, a push included.
func TestAdminTokenRotation(t *testing.T) {
	const grace = 3 * time.Second
	s := startSim(t, "--service-time", "0")
	vol := testutil.NewSecretVolume(t, map[string]string{"token": "token-0\n"})
	d := testutil.StartDispatcher(t, bins.Tiergate, testutil.DispatcherOptions{
		TokenFile: vol.Path("token"), Args: []string{"--admin-token-grace", grace.String(), "--log-format", "json"},
	})
	put := func(version int64, token string) (int, []byte) {
		b, _ := json.Marshal(basePolicy(version, 2, s.Addr))
		return d.AdminDo(t, http.MethodPut, "/v1/policy", token, b)
	}
	if code, body := put(1, "token-0"); code != http.StatusOK {
		t.Fatalf("PUT with the mounted token: %d %s", code, body)
	}
	var latencies []time.Duration
	version := int64(1)
	for i := 1; i <= 3; i++ {
		old, cur := "token-"+string(rune('0'+i-1)), "token-"+string(rune('0'+i))
		swapped := time.Now()
		vol.Update(map[string]string{"token": cur + "\n"})
		// The sending of the new token's last refusal and the answer of
		// its first acceptance bracket the moment the dispatcher rotated.
		var lastRefused, accepted time.Time
		testutil.EventuallyTrue(t, settle, cur+" accepted", func() bool {
			version++
			sent := time.Now()
			code, _ := put(version, cur)
			if code == http.StatusOK {
				accepted = time.Now()
				return true
			}
			lastRefused = sent
			return false
		})
		if lastRefused.IsZero() {
			lastRefused = swapped
		}
		latencies = append(latencies, accepted.Sub(swapped))
		version++
		if code, body := put(version, old); code != http.StatusOK {
			t.Errorf("the replaced %s right after the rotation: %d %s, want 200 within the grace", old, code, body)
		}
		var refused time.Time
		var body []byte
		testutil.EventuallyTrue(t, grace+settle, old+" refused once the grace ended", func() bool {
			var code int
			code, body = d.AdminDo(t, http.MethodGet, "/v1/stats", old, nil)
			refused = time.Now()
			return code == http.StatusUnauthorized
		})
		if early := refused.Sub(lastRefused); early < grace {
			t.Errorf("%s refused %s after the last moment before the rotation, before the %s grace ended", old, early, grace)
		}
		if late := refused.Sub(accepted); late > grace+2*time.Second {
			t.Errorf("%s still accepted %s after the rotation, grace %s", old, late, grace)
		}
		if e := adminErr(t, body); e.Error.Type != "unauthenticated" || e.Error.Message != "wrong bearer token" {
			t.Errorf("refusal of %s after the grace: %s", old, body)
		}
	}
	// A push with a token whose grace is over is refused, and the policy
	// it carried is not applied.
	code, body := put(version+1, "token-2")
	if e := adminErr(t, body); code != http.StatusUnauthorized || e.Error.Message != "wrong bearer token" {
		t.Errorf("PUT with the expired token-2: %d %s, want 401 wrong bearer token", code, body)
	}
	var held struct{ Version int64 }
	testutil.GetJSON(t, d.AdminURL("/v1/policy"), "token-3", &held)
	if held.Version != version {
		t.Errorf("the dispatcher holds version %d, want %d: the refused push was applied", held.Version, version)
	}
	if n := strings.Count(d.Output(), `"msg":"token file changed: the new token is in force"`); n != 3 {
		t.Errorf("%d rotations logged, want 3:\n%s", n, d.Output())
	}
	sort.Slice(latencies, func(a, b int) bool { return latencies[a] < latencies[b] })
	t.Logf("swap to first accepted push: median %s, max %s (poll interval 1s)", latencies[len(latencies)/2], latencies[len(latencies)-1])
	for _, l := range latencies {
		if l > 3*time.Second {
			t.Errorf("a new token took %s to be accepted, want within seconds (latencies %v)", l, latencies)
		}
	}

	// A swap to an empty token is not a rotation: the token in force stays.
	vol.Update(map[string]string{"token": "\n"})
	d.WaitOutput(t, settle, "the empty token file logged", func(out string) bool {
		return strings.Contains(out, `"msg":"keeping the token read before"`) && strings.Contains(out, "the token file is empty")
	})
	if code, body := d.AdminDo(t, http.MethodGet, "/v1/stats", "token-3", nil); code != http.StatusOK {
		t.Errorf("token-3 after an empty swap: %d %s", code, body)
	}
	d.StopClean(t, 20*time.Second)
}

func adminErr(t *testing.T, body []byte) adminError {
	t.Helper()
	var e adminError
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("admin error body %q: %v", body, err)
	}
	return e
}

// A dispatcher that cannot start with its token flags says why and exits 2.
func TestAdminTokenFlagsRefused(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	tests := map[string]struct {
		args []string
		want string
	}{
		"missing file":   {[]string{"--admin-token-file", missing}, `"msg"="cannot read --admin-token-file" "error"="token file: stat ` + missing + `: no such file or directory"`},
		"empty file":     {[]string{"--admin-token-file", empty}, `"msg"="cannot read --admin-token-file" "error"="the token file is empty: ` + empty + `"`},
		"grace too long": {[]string{"--admin-token-grace", "61s"}, "tiergate dispatcher: --admin-token-grace 1m1s must be between 0s and 1m0s"},
		"negative grace": {[]string{"--admin-token-grace", "-1s"}, "tiergate dispatcher: --admin-token-grace -1s must be between 0s and 1m0s"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"dispatcher", "--log-format", "text", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, tc.args...)
			out, err := exec.Command(bins.Tiergate, args...).CombinedOutput()
			if code, ok := testutil.ExitCode(err); !ok || code != 2 {
				t.Errorf("exit %v, want 2\n%s", err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("output lacks %q:\n%s", tc.want, out)
			}
		})
	}
}
