package admin

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/tokenfile"
)

// The admin API with a followed token file, through a rotation: the new
// token opens it at once, the replaced one until its grace ends, then 401.
func TestRotatedTokenFile(t *testing.T) {
	vol := testutil.NewSecretVolume(t, map[string]string{"token": "first-token\n"})
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	tokens, err := tokenfile.New(tokenfile.Options{Path: vol.Path("token"), Grace: 30 * time.Second, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tokens.Poll(); err != nil {
		t.Fatal(err)
	}
	// Tokens takes precedence over a fixed Token.
	h, err := New(Config{Token: []byte("fixed"), Tokens: tokens, Gatherer: prometheus.NewRegistry(), Log: logr.Discard()}, &fakeDispatcher{})
	if err != nil {
		t.Fatal(err)
	}
	const wrong = `{"error":{"type":"unauthenticated","message":"wrong bearer token"}}`
	const ok = `{"queued":3}`
	steps := []struct {
		name  string
		act   func()
		token string
		code  int
		body  string
	}{
		{"the fixed token is not used", nil, "fixed", 401, wrong},
		{"the mounted token", nil, "first-token", 200, ok},
		{"the new token before a poll", func() { vol.Update(map[string]string{"token": "second-token"}) }, "second-token", 401, wrong},
		{"the new token after the poll", func() { mustPoll(t, tokens) }, "second-token", 200, ok},
		{"the replaced token within the grace", func() { clk.Step(30*time.Second - time.Millisecond) }, "first-token", 200, ok},
		{"the replaced token after the grace", func() { clk.Step(time.Millisecond) }, "first-token", 401, wrong},
		{"the new token after the grace", nil, "second-token", 200, ok},
		{"a prefix of the new token", nil, "second", 401, wrong},
	}
	for _, s := range steps {
		if s.act != nil {
			s.act()
		}
		req := httptest.NewRequest(http.MethodGet, "/v1/stats", nil)
		req.Header.Set("Authorization", "Bearer "+s.token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != s.code {
			t.Errorf("%s: %d, want %d", s.name, rec.Code, s.code)
		}
		if diff := cmp.Diff(s.body, strings.TrimSpace(rec.Body.String())); diff != "" {
			t.Errorf("%s: body (-want +got):\n%s", s.name, diff)
		}
	}
}

func mustPoll(t *testing.T, f *tokenfile.Follower) {
	t.Helper()
	if changed, err := f.Poll(); !changed || err != nil {
		t.Fatalf("Poll = %v, %v; want a change", changed, err)
	}
}

func TestStaticToken(t *testing.T) {
	tests := map[string]struct {
		cfg  Config
		tok  string
		want bool
		nilT bool
	}{
		"no token disables":    {cfg: Config{}, nilT: true},
		"empty token disables": {cfg: Config{Token: []byte{}}, nilT: true},
		"the token":            {cfg: Config{Token: []byte("abc")}, tok: "abc", want: true},
		"a longer one":         {cfg: Config{Token: []byte("abc")}, tok: "abcd"},
		"a shorter one":        {cfg: Config{Token: []byte("abc")}, tok: "ab"},
		"the empty one":        {cfg: Config{Token: []byte("abc")}, tok: ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tk := tokensOf(tc.cfg)
			if tc.nilT {
				if tk != nil {
					t.Fatalf("tokensOf = %v, want nil", tk)
				}
				return
			}
			if got := tk.Verify([]byte(tc.tok)); got != tc.want {
				t.Errorf("Verify(%q) = %v, want %v", tc.tok, got, tc.want)
			}
		})
	}
}
