package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
)

// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch

// authView is what the authentication conditions are computed from.
type authView struct {
	Mode           v1alpha1.AuthenticationMode
	HeaderName     string
	TrustedSources []v1alpha1.CIDR
	// JWKS is the reading of a JWT pool's keys.
	JWKS jwksReading
}

// jwksReading is a JWT pool's key set as the controller read it.
type jwksReading struct {
	// Keys go into the policy; nil pushes an empty set.
	Keys *policy.JWKS
	// Reason and Message are the JWKSReady condition's.
	Reason  v1alpha1.ModelPoolReason
	Message string
}

func newAuthView(spec v1alpha1.Authentication, jwks jwksReading) authView {
	return authView{Mode: spec.Mode, HeaderName: spec.HeaderName, TrustedSources: spec.TrustedSources, JWKS: jwks}
}

// setAuthConditions sets TenantHeaderUnprotected in TrustedHeader mode and
// JWKSReady in JWT mode, and removes each in the other modes.
func setAuthConditions(conds *[]metav1.Condition, now metav1.Time, gen int64, v authView) {
	switch {
	case v.Mode != v1alpha1.AuthTrustedHeader:
		meta.RemoveStatusCondition(conds, v1alpha1.ModelPoolTenantHeaderUnprotected)
	case len(v.TrustedSources) == 0:
		setCondition(conds, now, gen, v1alpha1.ModelPoolTenantHeaderUnprotected, true, string(v1alpha1.ReasonNoTrustedSources),
			fmt.Sprintf("any client that reaches the dispatchers can name any tenant in the %s header; set spec.authentication.trustedSources "+
				"to the CIDRs of the gateway that sets it (for example 10.0.12.0/24), or use mode APIKey or JWT", v.HeaderName))
	default:
		srcs := make([]string, len(v.TrustedSources))
		for i, s := range v.TrustedSources {
			srcs[i] = string(s)
		}
		setCondition(conds, now, gen, v1alpha1.ModelPoolTenantHeaderUnprotected, false, string(v1alpha1.ReasonTrustedSourcesSet),
			fmt.Sprintf("the %s header is believed only from %s", v.HeaderName, strings.Join(srcs, ", ")))
	}
	if v.Mode != v1alpha1.AuthJWT {
		meta.RemoveStatusCondition(conds, v1alpha1.ModelPoolJWKSReady)
		return
	}
	setCondition(conds, now, gen, v1alpha1.ModelPoolJWKSReady, v.JWKS.Reason == v1alpha1.ReasonJWKSLoaded, string(v.JWKS.Reason), v.JWKS.Message)
}

// noKeys ends every message of a JWKS that is not in force.
const noKeys = "; the policy carries no keys, so every token is refused"

// readJWKS reads a JWT pool's key set from its Secret or ConfigMap, or
// takes what the fetcher last got from its URL, and passes the fetcher
// the key IDs the dispatchers saw and lacked.
func (r *PoolReconciler) readJWKS(ctx context.Context, pool *v1alpha1.ModelPool) (jwksReading, error) {
	a := pool.Spec.Authentication
	fromURL := a.Mode == v1alpha1.AuthJWT && a.JWT != nil && a.JWT.JWKS.URL != ""
	if r.JWKS != nil && !fromURL {
		// Stop refreshing a URL the pool no longer names.
		r.JWKS.Forget(types.NamespacedName{Namespace: pool.Namespace, Name: pool.Name})
	}
	if a.Mode != v1alpha1.AuthJWT || a.JWT == nil {
		return jwksReading{}, nil
	}
	src := a.JWT.JWKS
	switch {
	case src.SecretRef != nil:
		var s corev1.Secret
		what := fmt.Sprintf("Secret %q", src.SecretRef.Name)
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: src.SecretRef.Name}, &s)
		if apierrors.IsNotFound(err) {
			return notFound("%s does not exist or lacks the label %s: \"true\" (the controller sees no other Secret)", what, v1alpha1.APIKeysLabel), nil
		} else if err != nil {
			return jwksReading{}, err
		}
		return fromDocument(what, src.SecretRef.Key, s.Data[src.SecretRef.Key]), nil
	case src.ConfigMapRef != nil:
		var cm corev1.ConfigMap
		what := fmt.Sprintf("ConfigMap %q", src.ConfigMapRef.Name)
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: src.ConfigMapRef.Name}, &cm)
		if apierrors.IsNotFound(err) {
			return notFound("%s does not exist or lacks the label %s: \"true\" (the controller sees no other ConfigMap)", what, v1alpha1.LabelJWKS), nil
		} else if err != nil {
			return jwksReading{}, err
		}
		doc, ok := cm.Data[src.ConfigMapRef.Key]
		if !ok {
			return fromDocument(what, src.ConfigMapRef.Key, cm.BinaryData[src.ConfigMapRef.Key]), nil
		}
		return fromDocument(what, src.ConfigMapRef.Key, []byte(doc)), nil
	default:
		return r.fetchedJWKS(pool, src), nil
	}
}

func notFound(format string, args ...any) jwksReading {
	return jwksReading{Reason: v1alpha1.ReasonJWKSNotFound, Message: fmt.Sprintf(format, args...) + noKeys}
}

// fromDocument decodes the JWKS held under key of the object what.
func fromDocument(what, key string, doc []byte) jwksReading {
	if len(doc) == 0 {
		return notFound("%s has no key %q", what, key)
	}
	keys, skipped, err := DecodeJWKS(doc)
	if err != nil {
		return jwksReading{Reason: v1alpha1.ReasonJWKSInvalid, Message: fmt.Sprintf("%s key %q: %v", what, key, err) + noKeys}
	}
	return loaded(keys, skipped, fmt.Sprintf("%s key %q", what, key))
}

func loaded(keys *policy.JWKS, skipped int, from string) jwksReading {
	kids := make([]string, 0, len(keys.Keys))
	for _, k := range keys.Keys {
		if k.Kid != "" {
			kids = append(kids, k.Kid)
		}
	}
	sort.Strings(kids)
	msg := fmt.Sprintf("%d signing keys from %s", len(keys.Keys), from)
	if len(kids) > 0 {
		msg += " (key IDs " + listNames(kids) + ")"
	}
	if skipped > 0 {
		msg += fmt.Sprintf("; %d keys that are not RSA, EC or Ed25519 signing keys are left out", skipped)
	}
	return jwksReading{Keys: keys, Reason: v1alpha1.ReasonJWKSLoaded, Message: msg}
}

// ErrInvalidJWKS is wrapped by DecodeJWKS errors.
var ErrInvalidJWKS = errors.New("invalid JWKS")

// DecodeJWKS parses a JWKS document and keeps the keys a dispatcher can
// verify with: RSA, EC and OKP keys whose use is "sig" or unset; skipped
// counts the others (encryption keys, other key types). A key with private
// key material refuses the whole document, so it is never pushed; so does
// a signing key that policy validation would refuse, or a set with no
// signing key at all.
func DecodeJWKS(doc []byte) (*policy.JWKS, int, error) {
	var raw policy.JWKS
	if err := json.Unmarshal(doc, &raw); err != nil {
		return nil, 0, fmt.Errorf("%w: not a JSON Web Key Set: %v", ErrInvalidJWKS, err)
	}
	out := &policy.JWKS{Keys: []policy.JWK{}}
	skipped := 0
	for i, k := range raw.Keys {
		if len(k.PrivateMembers) > 0 {
			return nil, 0, fmt.Errorf("%w: keys[%d] holds private key material (%s); publish only the public keys",
				ErrInvalidJWKS, i, strings.Join(k.PrivateMembers, ", "))
		}
		if (k.Use != "" && k.Use != "sig") || (k.Kty != "RSA" && k.Kty != "EC" && k.Kty != "OKP") {
			skipped++
			continue
		}
		k.UnknownMembers = nil // dropped: the dispatchers never see them
		out.Keys = append(out.Keys, k)
	}
	if len(out.Keys) == 0 {
		return nil, skipped, fmt.Errorf("%w: it holds no RSA, EC or Ed25519 signing key", ErrInvalidJWKS)
	}
	if errs := policy.CheckJWKS("keys", *out); len(errs) > 0 {
		return nil, 0, fmt.Errorf("%w: %v", ErrInvalidJWKS, errs[0])
	}
	return out, skipped, nil
}

// fetchedJWKS is the URL's key set as the fetcher holds it.
func (r *PoolReconciler) fetchedJWKS(pool *v1alpha1.ModelPool, src v1alpha1.JWKSSource) jwksReading {
	if r.JWKS == nil {
		return jwksReading{Reason: v1alpha1.ReasonJWKSFetchFailed, Message: "this controller fetches no JWKS URL" + noKeys}
	}
	key := types.NamespacedName{Namespace: pool.Namespace, Name: pool.Name}
	interval := defaultJWKSRefresh
	if src.RefreshInterval != nil {
		interval = src.RefreshInterval.Duration
	}
	var unknown []string
	for _, s := range r.Pusher.States(key) {
		unknown = append(unknown, s.Stats.UnknownKeyIDs...)
	}
	got := r.JWKS.Watch(key, src.URL, interval, unknown)
	switch {
	case got.Keys != nil:
		rd := loaded(got.Keys, got.Skipped, src.URL)
		if got.Err != nil {
			rd.Message += fmt.Sprintf("; the last fetch failed and these keys stay: %v", got.Err)
		}
		return rd
	case got.Err != nil:
		return jwksReading{Reason: v1alpha1.ReasonJWKSFetchFailed, Message: fmt.Sprintf("fetching %s: %v", src.URL, got.Err) + noKeys}
	default:
		return jwksReading{Reason: v1alpha1.ReasonJWKSPending, Message: fmt.Sprintf("fetching %s for the first time", src.URL) + noKeys}
	}
}

// jwksRefOf is the name of the pool's JWKS object of kind, "" when none.
func jwksRefOf(o client.Object, configMap bool) []string {
	j := o.(*v1alpha1.ModelPool).Spec.Authentication.JWT
	if j == nil {
		return nil
	}
	if ref := j.JWKS.SecretRef; !configMap && ref != nil {
		return []string{ref.Name}
	}
	if ref := j.JWKS.ConfigMapRef; configMap && ref != nil {
		return []string{ref.Name}
	}
	return nil
}

// poolsByIndex maps an object to the pools of its namespace whose field
// index names it.
func poolsByIndex(c client.Reader, index string) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []ctrl.Request {
		var pools v1alpha1.ModelPoolList
		if err := c.List(ctx, &pools, client.InNamespace(o.GetNamespace()), client.MatchingFields{index: o.GetName()}); err != nil {
			return nil
		}
		out := make([]ctrl.Request, 0, len(pools.Items))
		for _, p := range pools.Items {
			out = append(out, poolRequest(p.Namespace, p.Name))
		}
		return out
	}
}

// JWKSConfigMapCache is the manager cache's rule for ConfigMaps: only
// those labelled tiergate.dev/jwks: "true" are listed, watched and kept.
func JWKSConfigMapCache() (client.Object, cache.ByObject) {
	return &corev1.ConfigMap{}, cache.ByObject{Label: labels.SelectorFromSet(labels.Set{v1alpha1.LabelJWKS: "true"})}
}
