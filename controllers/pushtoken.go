package controllers

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tiergate/tiergate/internal/tokenfile"
)

// TokenSource supplies the bearer tokens of one push, in the order to try
// them: the dispatcher's 401 to one moves on to the next. None means the
// push carries no token.
type TokenSource interface {
	PushTokens() ([]string, error)
}

// pushTokens is the push client's TokenSource. The token file is followed
// through every push: one stat each, and a read when the file behind the
// path changed, as when the kubelet swaps a Secret volume. After a
// rotation the replaced token is tried second for tokenfile.MaxGrace, so
// a dispatcher that has not seen the new file yet still takes the push.
// The token read from the managed Secret comes last: it serves until the
// kubelet fills the controller's own (optional) volume.
type pushTokens struct {
	file *tokenfile.Follower // nil without --push-token-file

	mu         sync.Mutex
	fromSecret string
}

func newPushTokens(path string, clk clock.Clock) (*pushTokens, error) {
	t := &pushTokens{}
	if path == "" {
		return t, nil
	}
	f, err := tokenfile.New(tokenfile.Options{Path: path, Grace: tokenfile.MaxGrace, Clock: clk})
	if err != nil {
		return nil, err
	}
	t.file = f
	return t, nil
}

// PushTokens implements TokenSource. A file that cannot be read is an
// error only while no token is known at all.
func (t *pushTokens) PushTokens() ([]string, error) {
	var out []string
	var readErr error
	add := func(tok string) {
		for _, have := range out {
			if have == tok {
				return
			}
		}
		if tok != "" {
			out = append(out, tok)
		}
	}
	if t.file != nil {
		if _, err := t.file.Poll(); err != nil {
			readErr = err
		}
		cur, prev := t.file.Tokens()
		add(cur)
		add(prev)
	}
	t.mu.Lock()
	add(t.fromSecret)
	t.mu.Unlock()
	if len(out) == 0 && readErr != nil {
		return nil, fmt.Errorf("reading the push token: %w", readErr)
	}
	return out, nil
}

func (t *pushTokens) setFromSecret(tok string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fromSecret = tok
}

// setupPushTokens follows the push token file and, when the controller
// manages the token Secret, adds the runnable that keeps it in existence.
func setupPushTokens(mgr ctrl.Manager, opts Config) (*pushTokens, error) {
	tokens, err := newPushTokens(opts.PushTokenFile, opts.Clock)
	if err != nil {
		return nil, err
	}
	if opts.PushTokenSecret.Name == "" {
		return tokens, nil
	}
	return tokens, mgr.Add(&tokenSecret{
		key: opts.PushTokenSecret, dataKey: opts.PushTokenSecretKey,
		reader: mgr.GetAPIReader(), writer: mgr.GetClient(), tokens: tokens,
		clock: opts.Clock, interval: opts.PushTokenSecretInterval, log: mgr.GetLogger().WithName("push-token"),
	})
}

// putWithTokens sends the push with each token in turn while the
// dispatcher answers 401, and returns the last answer.
func (p *Pusher) putWithTokens(ctx context.Context, address string, tokens []string, body []byte) (reply, error) {
	if len(tokens) == 0 {
		tokens = []string{""}
	}
	var r reply
	var err error
	for _, tok := range tokens {
		if r, err = p.put(ctx, address, tok, body); err != nil || r.code != http.StatusUnauthorized {
			break
		}
	}
	return r, err
}

// tokenLength and tokenAlphabet make a generated push token: 48 of 62
// symbols, about 285 bits.
const (
	tokenLength   = 48
	tokenAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
)

func newToken() (string, error) {
	out := make([]byte, 0, tokenLength)
	buf := make([]byte, 2*tokenLength)
	for len(out) < tokenLength {
		if _, err := rand.Read(buf); err != nil {
			return "", err
		}
		for _, b := range buf {
			// 248 = 4 × 62: a byte below it picks a symbol without bias.
			if b < 248 && len(out) < tokenLength {
				out = append(out, tokenAlphabet[int(b)%len(tokenAlphabet)])
			}
		}
	}
	return string(out), nil
}

// tokenSecret keeps the push token Secret in existence: when it is
// missing, or holds no token under its key, the controller writes a new
// random token there. It reads only that Secret, by name, around the
// cache. The kubelet then puts the token into the volumes of the
// controller and the dispatchers, which follow their files.
type tokenSecret struct {
	key      types.NamespacedName
	dataKey  string
	reader   client.Reader // uncached: the Secret is not labelled for the cache
	writer   client.Writer
	tokens   *pushTokens
	clock    clock.WithTicker
	interval time.Duration
	log      logr.Logger
}

// Start checks the Secret at once and then every interval until ctx ends.
// A failed check is logged and retried; it never stops the manager.
func (s *tokenSecret) Start(ctx context.Context) error {
	t := s.clock.NewTicker(s.interval)
	defer t.Stop()
	for {
		if err := s.ensure(ctx); err != nil && ctx.Err() == nil {
			s.log.Error(err, "cannot ensure the push token Secret", "secret", s.key.String())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
	}
}

// ensure creates the Secret with a new token, fills in a missing or empty
// token, or just learns the token in place.
func (s *tokenSecret) ensure(ctx context.Context) error {
	var sec corev1.Secret
	err := s.reader.Get(ctx, s.key, &sec)
	switch {
	case apierrors.IsNotFound(err):
		return s.create(ctx)
	case err != nil:
		return err
	}
	if tok := bytes.TrimSpace(sec.Data[s.dataKey]); len(tok) > 0 {
		s.tokens.setFromSecret(string(tok))
		return nil
	}
	tok, err := newToken()
	if err != nil {
		return err
	}
	if sec.Data == nil {
		sec.Data = map[string][]byte{}
	}
	sec.Data[s.dataKey] = []byte(tok)
	if err := s.writer.Update(ctx, &sec); err != nil {
		return err
	}
	s.log.Info("wrote a new token into the push token Secret, which had none", "secret", s.key.String(), "key", s.dataKey)
	s.tokens.setFromSecret(tok)
	return nil
}

func (s *tokenSecret) create(ctx context.Context) error {
	tok, err := newToken()
	if err != nil {
		return err
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.key.Namespace, Name: s.key.Name, Labels: map[string]string{
			"app.kubernetes.io/name":       "tiergate",
			"app.kubernetes.io/component":  "push-token",
			"app.kubernetes.io/managed-by": "tiergate-controller",
		}},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{s.dataKey: []byte(tok)},
	}
	if err := s.writer.Create(ctx, sec); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return err
		}
		// Another replica was first: use its token.
		if err := s.reader.Get(ctx, s.key, sec); err != nil {
			return err
		}
		tok = string(bytes.TrimSpace(sec.Data[s.dataKey]))
		s.tokens.setFromSecret(tok)
		return nil
	}
	s.log.Info("created the push token Secret", "secret", s.key.String(), "key", s.dataKey)
	s.tokens.setFromSecret(tok)
	return nil
}
