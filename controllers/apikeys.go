package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tiergate/tiergate/api/v1alpha1"
)

// hashAPIKeys returns the SHA-256 (lowercase hex) of each API key the
// Secret holds under keys (every key of the Secret when keys is empty),
// sorted, and the requested keys the Secret lacks. Surrounding whitespace is
// trimmed first, because a key written from a file usually ends in a
// newline that no client sends. The plaintext goes nowhere else.
func hashAPIKeys(secret *corev1.Secret, keys []string) (hashes, missing []string) {
	names := keys
	if len(names) == 0 {
		for k := range secret.Data {
			names = append(names, k)
		}
		for k := range secret.StringData {
			if _, dup := secret.Data[k]; !dup {
				names = append(names, k)
			}
		}
		sort.Strings(names)
	}
	for _, k := range names {
		v, ok := secret.Data[k]
		if !ok {
			s, sok := secret.StringData[k]
			if !sok {
				missing = append(missing, k)
				continue
			}
			v = []byte(s)
		}
		key := strings.TrimSpace(string(v))
		if key == "" {
			missing = append(missing, k)
			continue
		}
		sum := sha256.Sum256([]byte(key))
		hashes = append(hashes, hex.EncodeToString(sum[:]))
	}
	sort.Strings(hashes)
	return hashes, missing
}

// apiKeysSelector selects the Secrets the controller caches and reads.
var apiKeysSelector = labels.SelectorFromSet(labels.Set{v1alpha1.APIKeysLabel: "true"})

// CacheByObject is the per-object configuration of the manager's cache.
// Secrets are listed and watched with the API-keys label selector, so the
// API server never sends the controller any other Secret and the cache
// never keeps one: a Get of an unlabelled Secret through the cache is
// NotFound. ConfigMaps likewise: only those labelled tiergate.dev/jwks,
// which hold a JWT pool's keys.
func CacheByObject() map[client.Object]cache.ByObject {
	cm, byCM := JWKSConfigMapCache()
	return map[client.Object]cache.ByObject{
		&corev1.Secret{}: {Label: apiKeysSelector},
		cm:               byCM,
	}
}

// errSecretNotCached: the API server has a labelled Secret the cache has
// not received yet; its watch event follows and the reconcile is retried.
var errSecretNotCached = errors.New("the Secret is labelled but not in the cache yet")

// readAPIKeySecret hashes the keys of a quota's Secret, read from the
// cache. On a miss, the Secret's metadata alone (never its data) is read
// from the API server, to tell a Secret without the label, whose keys are
// not pushed, from one that does not exist.
func (r *PoolReconciler) readAPIKeySecret(ctx context.Context, ns string, ref *v1alpha1.SecretKeysReference) ([]string, secretState, error) {
	key := types.NamespacedName{Namespace: ns, Name: ref.Name}
	st := secretState{name: ref.Name}
	var secret corev1.Secret
	err := r.Client.Get(ctx, key, &secret)
	switch {
	case err == nil:
		hashes, missing := hashAPIKeys(&secret, ref.Keys)
		st.keys = missing
		return hashes, st, nil
	case !apierrors.IsNotFound(err):
		return nil, st, err
	}
	if r.APIReader == nil {
		st.missing = true
		return nil, st, nil
	}
	meta := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"}}
	err = r.APIReader.Get(ctx, key, meta)
	switch {
	case apierrors.IsNotFound(err):
		st.missing = true
	case err != nil:
		return nil, st, err
	case apiKeysSelector.Matches(labels.Set(meta.Labels)):
		return nil, st, fmt.Errorf("secret %s: %w", key, errSecretNotCached)
	default:
		st.unlabelled = true
	}
	return nil, st, nil
}
