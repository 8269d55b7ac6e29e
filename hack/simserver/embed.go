package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// embeddingDims is the length of every placeholder embedding.
const embeddingDims = 8

// embed answers POST /v1/embeddings: one placeholder vector per input, and
// usage with the input's prompt tokens. It takes a generation slot for the
// prefill time of its tokens (or --service-time), as vLLM's pooling runs do.
func (s *server) embed(w http.ResponseWriter, r *http.Request) {
	req, ok := s.readRequest(w, r)
	if !ok {
		return
	}
	if len(bytes.TrimSpace(req.Input)) == 0 {
		openAIError(w, http.StatusBadRequest, "input is required")
		return
	}
	size, err := promptValueSize(req.Input, 0)
	if err != nil {
		openAIError(w, http.StatusBadRequest, "bad input: "+err.Error())
		return
	}
	prompt := s.tok.promptTokens(size)
	d, ok := s.serviceTime(w, r)
	if !ok {
		return
	}
	switch {
	case d >= 0:
	case s.tok.prefill > 0:
		d = time.Duration(float64(prompt) / s.tok.prefill * float64(time.Second))
	default:
		d = s.dist.Sample()
	}
	model := req.Model
	if model == "" {
		model = s.model
	}
	s.serve(r, func(ctx context.Context) (int, bool) {
		t := time.NewTimer(time.Hour)
		defer t.Stop()
		if !wait(ctx, t, d) {
			return 0, false
		}
		data := make([]any, inputs(req.Input))
		for i := range data {
			vec := make([]float64, embeddingDims)
			for j := range vec {
				vec[j] = float64(j+1) / embeddingDims
			}
			data[i] = map[string]any{"object": "embedding", "index": i, "embedding": vec}
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"object": "list", "data": data, "model": model,
			"usage": map[string]int{"prompt_tokens": prompt, "total_tokens": prompt},
		})
		return 0, ctx.Err() == nil
	}, prompt)
}

// inputs is how many embeddings an input asks for: one per string or
// token-ID list in a list, else one.
func inputs(raw json.RawMessage) int {
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil || len(list) == 0 {
		return 1
	}
	switch bytes.TrimSpace(list[0])[0] {
	case '"', '[':
		return len(list)
	}
	return 1
}
