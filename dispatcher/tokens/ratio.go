package tokens

import (
	"math"
	"sync"
)

// The range of a bytes-per-token ratio: a sample or an estimate outside it
// is brought to its edge. Below 1 byte per token no tokenizer goes; above
// 32 the prompt is mostly something other than text.
const (
	MinBytesPerToken = 1
	MaxBytesPerToken = 32
)

const (
	// ratioWeight is the weight of one sample in the moving estimate: it
	// moves 5% of the way (in log space) to each sample, so from 4 it
	// comes within 1% of a true ratio of 3 in 66 samples and of 6 in 73
	// (TestRatioConverges).
	ratioWeight = 0.05
	// ratioStride bounds what one sample may pull: a sample counts as at
	// most twice or half the estimate, so one odd answer moves the
	// estimate by at most 2^ratioWeight (3.5%).
	ratioStride = math.Ln2
)

// Ratio is a pool's bytes per prompt token, learned from the backends'
// usage.prompt_tokens: an exponentially weighted moving average of the
// observed ratios in log space (ratios are multiplicative: halving and
// doubling are errors of the same size), each sample clamped to
// [MinBytesPerToken, MaxBytesPerToken] and to a factor of 2 of the
// estimate. What is learned includes what the chat template adds to the
// prompt. A Ratio is safe for concurrent use.
type Ratio struct {
	mu    sync.Mutex
	log   float64 // ln of the estimate
	value float64 // the estimate, exp(log)
}

// NewRatio starts a ratio at initial (DefaultBytesPerToken for a new pool),
// brought into range; NaN starts it at DefaultBytesPerToken.
func NewRatio(initial float64) *Ratio {
	v := clampRatio(initial)
	return &Ratio{log: math.Log(v), value: v}
}

// Value is the current estimate, in [MinBytesPerToken, MaxBytesPerToken].
func (r *Ratio) Value() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.value
}

// Observe learns from one answer: its prompt's text bytes (Cost.PromptBytes)
// and the prompt_tokens its usage reported. It returns the prompt
// estimate at the ratio before this sample divided by the actual tokens
// (for the tiergate_token_estimate_error_ratio histogram); ok is false,
// and nothing is learned, for a sample without bytes or tokens.
func (r *Ratio) Observe(promptBytes, promptTokens int64) (estimateOverActual float64, ok bool) {
	if promptBytes <= 0 || promptTokens <= 0 {
		return 0, false
	}
	sample := math.Log(clampRatio(float64(promptBytes) / float64(promptTokens)))
	r.mu.Lock()
	defer r.mu.Unlock()
	estimate := promptTokensOf(promptBytes, 0, r.value)
	sample = min(max(sample, r.log-ratioStride), r.log+ratioStride)
	r.log += ratioWeight * (sample - r.log)
	r.log = min(max(r.log, math.Log(MinBytesPerToken)), math.Log(MaxBytesPerToken))
	r.value = math.Exp(r.log)
	return float64(estimate) / float64(promptTokens), true
}

// clampRatio brings v into [MinBytesPerToken, MaxBytesPerToken]; NaN is
// DefaultBytesPerToken.
func clampRatio(v float64) float64 {
	if math.IsNaN(v) {
		return DefaultBytesPerToken
	}
	return min(max(v, MinBytesPerToken), MaxBytesPerToken)
}
