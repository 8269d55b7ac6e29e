package tokens

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// No tokenizer library: the Go ports of tiktoken (github.com/pkoukk/
// tiktoken-go and its forks) fetch their vocabularies at run time unless a
// separate loader module embeds megabytes of them, and they encode
// OpenAI's vocabularies only, not those of the models a vLLM pool serves
// (Llama, Qwen, Mistral...). A ratio learned from the pool's own
// usage.prompt_tokens fits whatever model it serves, chat template
// included, at no cost per request.

// The OpenAI-compatible paths Estimate understands.
const (
	PathChat        = "/v1/chat/completions"
	PathCompletions = "/v1/completions"
	PathEmbeddings  = "/v1/embeddings"
)

// DefaultBytesPerToken is the ratio a pool starts from: English text in
// the common BPE vocabularies runs at about four bytes per token.
const DefaultBytesPerToken = 4

// MaxOutput caps the output a body can ask for (max_tokens × n × prompts).
// It is far beyond any model's context, so such a request is refused as
// Never by any budget, and the sums stay far from overflow.
const MaxOutput = 1 << 40

// Shape is the kind of request a Cost was estimated from.
type Shape int

// The shapes. Other is also a JSON path whose body is not a JSON object.
const (
	Other Shape = iota
	Chat
	Completion
	Embedding
)

// String names the shape, for logs and tests.
func (s Shape) String() string {
	switch s {
	case Chat:
		return "chat"
	case Completion:
		return "completion"
	case Embedding:
		return "embedding"
	default:
		return "other"
	}
}

// Cost is a request's estimated tokens.
type Cost struct {
	// Prompt is the prompt's estimated tokens: its text's bytes ÷ the
	// ratio, rounded up, plus any token ids it sends as such.
	Prompt int64
	// Output is the most the answer may generate: 0 for embeddings and
	// Other.
	Output int64
	// PromptBytes is the prompt text's bytes, what Ratio.Observe learns
	// from. It is 0 for Other (a raw body is no prompt text) and for
	// prompts sent as token ids.
	PromptBytes int64
	Shape       Shape
	// Stream: the body asks for a stream ("stream": true).
	Stream bool
	// IncludeUsage: the stream asks for a final usage chunk
	// (stream_options.include_usage).
	IncludeUsage bool
}

// Reservation is what the request reserves at admission.
func (c Cost) Reservation() int64 { return c.Prompt + c.Output }

// object is a JSON object's members by their exact names. Estimate reads
// requests through it, not through structs: encoding/json matches a
// struct's fields to keys case-insensitively and lets a later match
// overwrite an earlier one, while the servers behind read names exactly,
// so a "Content": "" or "MAX_TOKENS": 1 beside the real key would hide
// the prompt or the output the server will see. A repeated key counts
// once, the last, as Python's json reads it.
type object map[string]json.RawMessage

// objectOf decodes raw as an object; false when it is not one.
func objectOf(raw []byte) (object, bool) {
	if firstByte(raw) != '{' {
		return nil, false
	}
	var o object
	if json.Unmarshal(raw, &o) != nil {
		return nil, false
	}
	return o, true
}

// number is o[name] as a number; false when absent or not a number.
// Numbers read as float64, so 1e3 and 1000.0 mean what they say and a
// huge one saturates instead of failing.
func (o object) number(name string) (float64, bool) {
	var f float64
	if raw, ok := o[name]; !ok || json.Unmarshal(raw, &f) != nil {
		return 0, false
	}
	return f, true
}

// flag is o[name] when it is true; false for anything else.
func (o object) flag(name string) bool {
	var b bool
	raw, ok := o[name]
	return ok && json.Unmarshal(raw, &b) == nil && b
}

// Estimate is the cost of a request to path (the URL's path, no query)
// with body, at bytesPerToken (a Ratio's Value; brought into
// [MinBytesPerToken, MaxBytesPerToken], NaN read as the default) and the
// policy's defaultMaxTokens (below 1: policy.DefaultMaxTokens). A body
// that is not a JSON object, or a path that is not one of the three,
// costs len(body) ÷ bytesPerToken with no output.
// A field of the wrong type is ignored (as if absent): the backend will
// refuse such a body, and its settlement gives the reservation back.
func Estimate(path string, body []byte, bytesPerToken float64, defaultMaxTokens int) Cost {
	bytesPerToken = clampRatio(bytesPerToken)
	if defaultMaxTokens < 1 {
		defaultMaxTokens = policy.DefaultMaxTokens
	}
	shape := shapeOf(path)
	var o object
	if shape != Other {
		var ok bool
		if o, ok = objectOf(body); !ok {
			shape = Other
		}
	}
	var text, ids, prompts int64
	switch shape {
	case Chat:
		text, prompts = messagesBytes(o["messages"]), 1
	case Completion:
		text, ids, prompts = promptParts(o["prompt"])
	case Embedding:
		text, ids, _ = promptParts(o["input"])
	default:
		return Cost{Prompt: promptTokensOf(int64(len(body)), 0, bytesPerToken)}
	}
	c := Cost{
		Prompt:      promptTokensOf(text, ids, bytesPerToken),
		PromptBytes: text,
		Shape:       shape,
		Stream:      o.flag("stream"),
	}
	if opts, ok := objectOf(o["stream_options"]); ok {
		c.IncludeUsage = c.Stream && opts.flag("include_usage")
	}
	if shape != Embedding {
		c.Output = output(o, max(prompts, 1), defaultMaxTokens)
	}
	return c
}

func shapeOf(path string) Shape {
	switch path {
	case PathChat:
		return Chat
	case PathCompletions:
		return Completion
	case PathEmbeddings:
		return Embedding
	default:
		return Other
	}
}

// promptTokensOf is text ÷ ratio rounded up (so a prompt that is not
// empty is at least one token), plus the ids.
func promptTokensOf(text, ids int64, bytesPerToken float64) int64 {
	return ids + int64(math.Ceil(float64(text)/bytesPerToken))
}

// output is the most the answer may generate: max_completion_tokens, else
// max_tokens, else the default, times n, times the prompts of a batched
// completion (each prompt gets n choices). A maximum below 1 counts as
// absent, as vLLM reads `max_completion_tokens or max_tokens` (a negative
// one it refuses anyway); n below 1 counts as 1. The product is rounded
// up and saturates at MaxOutput.
func output(o object, prompts int64, defaultMaxTokens int) int64 {
	limit := float64(defaultMaxTokens)
	if v, ok := o.number("max_completion_tokens"); ok && v >= 1 {
		limit = v
	} else if v, ok := o.number("max_tokens"); ok && v >= 1 {
		limit = v
	}
	n := 1.0
	if v, ok := o.number("n"); ok && v >= 1 {
		n = v
	}
	out := math.Ceil(limit) * math.Ceil(n) * float64(prompts)
	if out >= MaxOutput {
		return MaxOutput
	}
	return int64(out)
}

// messagesBytes is the text of a chat request's messages.
func messagesBytes(raw json.RawMessage) int64 {
	var messages []object
	if !decodeArray(raw, &messages) {
		return 0
	}
	var n int64
	for _, m := range messages {
		n += contentBytes(m["content"])
	}
	return n
}

// contentBytes is a chat message's text: its content string, or the text
// of its parts (image and audio parts carry no text and count nothing).
func contentBytes(raw json.RawMessage) int64 {
	switch firstByte(raw) {
	case '"':
		return stringBytes(raw)
	case '[':
		var parts []object
		if !decodeArray(raw, &parts) {
			return 0
		}
		var n int64
		for _, p := range parts {
			n += stringBytes(p["text"])
		}
		return n
	}
	return 0
}

// stringBytes is the decoded length of raw when it is a string, else 0.
func stringBytes(raw json.RawMessage) int64 {
	var s string
	if firstByte(raw) != '"' || json.Unmarshal(raw, &s) != nil {
		return 0
	}
	return int64(len(s))
}

// promptParts reads a completion's prompt or an embedding's input: a
// string, an array of strings, an array of token ids or an array of such
// arrays. It returns the text's bytes, the token ids, and how many prompts
// the batch holds.
func promptParts(raw json.RawMessage) (text, ids, prompts int64) {
	switch firstByte(raw) {
	case '"':
		return stringBytes(raw), 0, 1
	case '[':
	default:
		return 0, 0, 0
	}
	// An array: its first element says which of the three it is.
	switch firstByte(bytes.TrimLeft(raw, " \t\r\n")[1:]) {
	case ']':
		return 0, 0, 0
	case '"':
		var ss []string
		if decodeArray(raw, &ss) {
			for _, s := range ss {
				text += int64(len(s))
			}
			return text, 0, int64(len(ss))
		}
	case '[':
		var nested [][]float64
		if decodeArray(raw, &nested) {
			for _, p := range nested {
				ids += int64(len(p))
			}
			return 0, ids, int64(len(nested))
		}
	default:
		var flat []float64
		if decodeArray(raw, &flat) {
			return 0, int64(len(flat)), 1
		}
	}
	return 0, 0, 0
}

// decodeArray decodes an array value into v: an element of the wrong
// type (a message that is not an object, a number among strings) is left
// zero and the rest still count.
func decodeArray(raw json.RawMessage, v any) bool {
	return partial(json.Unmarshal(raw, v))
}

// partial is whether a decoding error still left a value to read: none,
// or only fields of the wrong type.
func partial(err error) bool {
	if err == nil {
		return true
	}
	var typeErr *json.UnmarshalTypeError
	return errors.As(err, &typeErr)
}

// firstByte is the first byte of raw after white space, 0 when none.
func firstByte(raw []byte) byte {
	for _, b := range raw {
		switch b {
		case ' ', '\t', '\r', '\n':
		default:
			return b
		}
	}
	return 0
}
