package controllers

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/tokenfile"
)

// The push client through a rotation the dispatcher has not seen yet: the
// new token is sent first and the replaced one, refused or not, second,
// for as long as its grace lasts; after that only the new token is sent,
// and the dispatcher's 401 is PushUnauthorized.
func TestPushFollowsARotatedTokenFile(t *testing.T) {
	d := newDispatcherServer(t, serverOptions{token: "old-token"})
	vol := testutil.NewSecretVolume(t, map[string]string{"token": "old-token\n"})
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	p, err := NewPusher(withClock(testPusherOptions(vol.Path("token"), 5*time.Second), clk))
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name      string
		act       func()
		want      PushResult
		wantAuths []string
	}{
		{"the mounted token", nil, PushOK, []string{"Bearer old-token"}},
		{"the controller's file rotated first", func() { vol.Update(map[string]string{"token": "new-token"}) }, PushOK,
			[]string{"Bearer new-token", "Bearer old-token"}},
		{"still within the grace", func() { clk.Step(tokenfile.MaxGrace - time.Second) }, PushOK,
			[]string{"Bearer new-token", "Bearer old-token"}},
		{"after the grace", func() { clk.Step(time.Second) }, PushUnauthorized, []string{"Bearer new-token"}},
	}
	for i, s := range steps {
		if s.act != nil {
			s.act()
		}
		before, _ := d.seen()
		a := p.push(context.Background(), Target{Name: "d-0", Address: d.addr(), Policy: pushPolicy(int64(i + 1))}, policy.SchemaVersion)
		if a.result != s.want {
			t.Errorf("%s: push = %s (%v), want %s", s.name, a.result, a.err, s.want)
		}
		_, auths := d.seen()
		if diff := cmp.Diff(s.wantAuths, auths[len(before):]); diff != "" {
			t.Errorf("%s: Authorization headers sent (-want +got):\n%s", s.name, diff)
		}
	}
}

func TestPushTokens(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	tests := map[string]struct {
		file       string // "" none, "missing", or the token to write
		fromSecret string
		want       []string
		wantErr    error
	}{
		"no file, no Secret: no token":        {},
		"the file":                            {file: "file-token", want: []string{"file-token"}},
		"the Secret only":                     {fromSecret: "secret-token", want: []string{"secret-token"}},
		"the file first, then the Secret":     {file: "file-token", fromSecret: "secret-token", want: []string{"file-token", "secret-token"}},
		"the same token once":                 {file: "same", fromSecret: "same", want: []string{"same"}},
		"a missing file, no Secret: an error": {file: "missing", wantErr: fs.ErrNotExist},
		"a missing file, the Secret serves":   {file: "missing", fromSecret: "secret-token", want: []string{"secret-token"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := ""
			switch tc.file {
			case "":
			case "missing":
				path = missing
			default:
				path = testutil.NewSecretVolume(t, map[string]string{"token": tc.file}).Path("token")
			}
			tokens, err := newPushTokens(path, clocktesting.NewFakeClock(time.Unix(0, 0)))
			if err != nil {
				t.Fatal(err)
			}
			tokens.setFromSecret(tc.fromSecret)
			got, err := tokens.PushTokens()
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if err != nil && err.Error() != "reading the push token: token file: stat "+missing+": no such file or directory" {
				t.Errorf("error %q", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("tokens (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNewToken(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		tok, err := newToken()
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`^[A-Za-z0-9]{48}$`).MatchString(tok) {
			t.Fatalf("token %q is not 48 alphanumerics", tok)
		}
		if seen[tok] {
			t.Fatalf("token %q made twice", tok)
		}
		seen[tok] = true
	}
}

// tokenSecret against a fake API server, in each state the Secret can be
// in: what it writes, and which token pushes then carry.
func TestTokenSecretEnsure(t *testing.T) {
	key := types.NamespacedName{Namespace: "tiergate-system", Name: "tiergate-push-token"}
	existing := func(data map[string][]byte) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Data: data}
	}
	alnum48 := regexp.MustCompile(`^[A-Za-z0-9]{48}$`)
	raced := existing(map[string][]byte{"token": []byte("the-other-replicas-token")})
	tests := map[string]struct {
		objs      []client.Object
		funcs     interceptor.Funcs
		wantErr   string
		wantWrite string // "", "create" or "update"
		wantToken string // "" when a new random one is expected
	}{
		"missing: created":             {wantWrite: "create"},
		"present: its token is used":   {objs: []client.Object{existing(map[string][]byte{"token": []byte("kept-token\n")})}, wantToken: "kept-token"},
		"no token key: one is written": {objs: []client.Object{existing(map[string][]byte{"other": []byte("x")})}, wantWrite: "update"},
		"an empty token: one is written": {objs: []client.Object{existing(map[string][]byte{"token": []byte(" \n")})},
			wantWrite: "update"},
		"another replica created it first": {
			funcs: interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
				if err := c.Create(ctx, raced.DeepCopy()); err != nil {
					return err
				}
				return apierrors.NewAlreadyExists(corev1.Resource("secrets"), obj.GetName())
			}},
			wantToken: "the-other-replicas-token",
		},
		"the API server refuses the read": {
			funcs: interceptor.Funcs{Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
				return apierrors.NewForbidden(corev1.Resource("secrets"), key.Name, errors.New("RBAC"))
			}},
			wantErr: `secrets "tiergate-push-token" is forbidden: RBAC`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var writes []string
			funcs := tc.funcs
			create, update := funcs.Create, funcs.Update
			funcs.Create = func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				writes = append(writes, "create")
				if create != nil {
					return create(ctx, c, obj, opts...)
				}
				return c.Create(ctx, obj, opts...)
			}
			funcs.Update = func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
				writes = append(writes, "update")
				if update != nil {
					return update(ctx, c, obj, opts...)
				}
				return c.Update(ctx, obj, opts...)
			}
			c := newFakeClient(t, tc.objs, funcs)
			tokens := &pushTokens{}
			s := &tokenSecret{key: key, dataKey: "token", reader: c, writer: c, tokens: tokens, log: logr.Discard()}
			err := s.ensure(context.Background())
			if got := errString(err); got != tc.wantErr {
				t.Fatalf("ensure = %q, want %q", got, tc.wantErr)
			}
			var wantWrites []string
			if tc.wantWrite != "" {
				wantWrites = []string{tc.wantWrite}
			}
			if name == "another replica created it first" {
				wantWrites = []string{"create"}
			}
			if diff := cmp.Diff(wantWrites, writes); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
			if tc.wantErr != "" {
				return
			}
			got, _ := tokens.PushTokens()
			var sec corev1.Secret
			if err := c.Get(context.Background(), key, &sec); err != nil {
				t.Fatal(err)
			}
			stored := string(sec.Data["token"])
			switch {
			case tc.wantToken != "":
				if diff := cmp.Diff([]string{tc.wantToken}, got); diff != "" {
					t.Errorf("push tokens (-want +got):\n%s", diff)
				}
			case !alnum48.MatchString(stored) || !cmp.Equal([]string{stored}, got):
				t.Errorf("stored token %q, push tokens %v: want one new 48-character token", stored, got)
			}
			if tc.wantWrite == "create" {
				want := map[string]string{"app.kubernetes.io/name": "tiergate", "app.kubernetes.io/component": "push-token", "app.kubernetes.io/managed-by": "tiergate-controller"}
				if diff := cmp.Diff(want, sec.Labels); diff != "" || sec.Type != corev1.SecretTypeOpaque {
					t.Errorf("created Secret type %q, labels (-want +got):\n%s", sec.Type, diff)
				}
			}
		})
	}
}

// Start checks at once and then on every tick, and survives a failure.
func TestTokenSecretStart(t *testing.T) {
	key := types.NamespacedName{Namespace: "ns", Name: "tok"}
	var fail atomic.Bool
	fail.Store(true)
	gets := make(chan struct{}, 10)
	c := newFakeClient(t, nil, interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, k client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		gets <- struct{}{}
		if fail.Load() {
			return errors.New("API server down")
		}
		return c.Get(ctx, k, obj, opts...)
	}})
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	tokens := &pushTokens{}
	s := &tokenSecret{key: key, dataKey: "token", reader: c, writer: c, tokens: tokens, clock: clk, interval: time.Minute, log: logr.Discard()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	<-gets
	testutil.EventuallyTrue(t, 10*time.Second, "the ticker is armed", clk.HasWaiters)
	fail.Store(false)
	clk.Step(time.Minute)
	<-gets
	testutil.EventuallyTrue(t, 10*time.Second, "the Secret created at the second check", func() bool {
		got, _ := tokens.PushTokens()
		return len(got) == 1
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start = %v, want nil", err)
	}
}

func withClock(o PusherOptions, clk clock.WithTicker) PusherOptions {
	o.Clock = clk
	return o
}
