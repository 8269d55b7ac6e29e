package capacity

import (
	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
)

// policyAuthentication is the policy's authentication block for spec a:
// the tenant header and its trusted sources, API keys, or the JWT check
// with jwks, the public keys the controller read (an empty set when it has
// none yet: every token is then refused).
func policyAuthentication(a v1alpha1.Authentication, jwks *policy.JWKS) policy.Authentication {
	out := policy.Authentication{Mode: string(a.Mode)}
	switch a.Mode {
	case v1alpha1.AuthAPIKey:
	case v1alpha1.AuthJWT:
		if a.JWT == nil {
			break
		}
		keys := policy.JWKS{Keys: []policy.JWK{}}
		if jwks != nil {
			keys.Keys = append(keys.Keys, jwks.Keys...)
		}
		out.JWT = &policy.JWT{
			Issuer:      a.JWT.Issuer,
			Audiences:   append([]string(nil), a.JWT.Audiences...),
			TenantClaim: a.JWT.TenantClaim,
			JWKS:        keys,
		}
	default:
		out.HeaderName = a.HeaderName
		for _, c := range a.TrustedSources {
			out.TrustedSources = append(out.TrustedSources, string(c))
		}
	}
	return out
}
