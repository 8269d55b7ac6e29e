package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"
)

// tokenModel is how simserver counts a request's tokens and, when the
// rates are set, how long it takes to serve them. A real server's
// tokenizer is replaced by a fixed number of bytes per token, so that a
// test knows in advance what usage.prompt_tokens a prompt will report.
type tokenModel struct {
	// bytesPerToken: a prompt of b bytes of text is ceil(b / bytesPerToken)
	// tokens; token-ID prompts count one token per ID.
	bytesPerToken float64
	// output draws an answer's tokens, capped at the request's maximum;
	// nil gives every answer its whole maximum.
	output dist
	// prefill and decode are tokens per second of one generation slot; a
	// zero rate leaves its term out, and when both are zero the service
	// time comes from --service-time instead.
	prefill, decode float64
}

var errBadTokens = errors.New("bad token flags")

func (m tokenModel) validate() error {
	switch {
	case !(m.bytesPerToken > 0) || math.IsInf(m.bytesPerToken, 0):
		return fmt.Errorf("%w: --bytes-per-token must be > 0, got %v", errBadTokens, m.bytesPerToken)
	case m.prefill < 0 || math.IsInf(m.prefill, 0) || math.IsNaN(m.prefill):
		return fmt.Errorf("%w: --prefill-tokens-per-second must be >= 0, got %v", errBadTokens, m.prefill)
	case m.decode < 0 || math.IsInf(m.decode, 0) || math.IsNaN(m.decode):
		return fmt.Errorf("%w: --decode-tokens-per-second must be >= 0, got %v", errBadTokens, m.decode)
	}
	return nil
}

// timed says whether the token rates set the service time.
func (m tokenModel) timed() bool { return m.prefill > 0 || m.decode > 0 }

// promptTokens counts a prompt of textBytes bytes of text and ids token IDs.
func (m tokenModel) promptTokens(p promptSize) int {
	return int(math.Ceil(float64(p.textBytes)/m.bytesPerToken)) + p.ids
}

// outputTokens is how many tokens one answer has: a draw, at most limit;
// capped says the draw was more.
func (m tokenModel) outputTokens(limit int) (n int, capped bool) {
	if m.output == nil {
		return limit, false
	}
	n = max(0, int(math.Round(m.output.Sample())))
	return min(n, limit), n > limit
}

// timing is when the first token is due (the prefill, plus one decode
// step) and the gap between later ones, for a prompt and an answer of
// these sizes. Only meaningful when timed.
func (m tokenModel) timing(prompt int) (first, each time.Duration) {
	if m.decode > 0 {
		each = time.Duration(float64(time.Second) / m.decode)
	}
	if m.prefill > 0 {
		first = time.Duration(float64(prompt) / m.prefill * float64(time.Second))
	}
	return first + each, each
}

// promptSize is what a request's prompt holds.
type promptSize struct {
	textBytes int // bytes of prompt text
	ids       int // token IDs given as numbers
}

func (p *promptSize) add(q promptSize) { p.textBytes += q.textBytes; p.ids += q.ids }

// message is one chat message; its content is a string or a list of parts.
type message struct {
	Content json.RawMessage `json:"content"`
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// sizeOf measures a chat request's messages, or a completion's prompt or an
// embedding's input (a string, a list of strings, a list of token IDs, or a
// list of lists of token IDs).
func sizeOf(messages []message, prompt json.RawMessage) (promptSize, error) {
	var total promptSize
	for i, msg := range messages {
		s, err := contentSize(msg.Content)
		if err != nil {
			return promptSize{}, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		total.add(s)
	}
	if len(prompt) > 0 {
		s, err := promptValueSize(prompt, 0)
		if err != nil {
			return promptSize{}, err
		}
		total.add(s)
	}
	return total, nil
}

func contentSize(raw json.RawMessage) (promptSize, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return promptSize{}, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return promptSize{textBytes: len(s)}, nil
	}
	var parts []contentPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return promptSize{}, errors.New("not a string or a list of parts")
	}
	var n promptSize
	for _, p := range parts {
		if p.Type == "text" {
			n.textBytes += len(p.Text)
		}
	}
	return n, nil
}

// promptValueSize measures a string, a number (one token ID) or a list of
// either, at most two lists deep.
func promptValueSize(raw json.RawMessage, depth int) (promptSize, error) {
	raw = bytes.TrimSpace(raw)
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return promptSize{textBytes: len(s)}, nil
	}
	var id float64
	if err := json.Unmarshal(raw, &id); err == nil && depth > 0 {
		return promptSize{ids: 1}, nil
	}
	var list []json.RawMessage
	if depth < 2 && json.Unmarshal(raw, &list) == nil {
		var n promptSize
		for _, item := range list {
			s, err := promptValueSize(item, depth+1)
			if err != nil {
				return promptSize{}, err
			}
			n.add(s)
		}
		return n, nil
	}
	return promptSize{}, errors.New("prompt is not a string, a list of strings or a list of token IDs")
}

// usage is OpenAI's usage object, as vLLM reports it.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func newUsage(prompt, completion int) usage {
	return usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
}
