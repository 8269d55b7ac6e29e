package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
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
