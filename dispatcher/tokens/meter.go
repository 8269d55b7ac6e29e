package tokens

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
)

// The Meter's memory bounds.
const (
	// meterJSONCap: a JSON answer up to this size is kept and decoded
	// whole.
	meterJSONCap = 256 << 10
	// meterTailCap: of a larger JSON answer only the last bytes are kept,
	// and its top-level usage is looked for there (OpenAI-compatible
	// servers write usage after the choices).
	meterTailCap = 16 << 10
	// meterLineCap: an SSE line, or an event's data, longer than this is
	// skipped (the event is dropped); a usage or content chunk is a few
	// hundred bytes.
	meterLineCap = 64 << 10
	// meterKeepCap: Reset keeps buffers up to this capacity for the next
	// answer and drops larger ones, so a pool of meters does not pin a
	// large answer's buffer.
	meterKeepCap = 64 << 10
	// usageTries bounds the "usage" keys tried in a tail window.
	usageTries = 8
)

// meterCaps are a Meter's bounds; tests make them small.
type meterCaps struct{ json, tail, line int }

var defaultMeterCaps = meterCaps{json: meterJSONCap, tail: meterTailCap, line: meterLineCap}

// Meter watches an answer's body as the data path writes it to the client
// and tells what the request used. It reads a text/event-stream answer as
// SSE events (each split arbitrarily across writes) and any other answer
// as one JSON document. Its memory is bounded: at most the JSON cap (256
// KiB) for a JSON answer, a 16 KiB tail window beyond it, and one SSE line
// and one event's data of at most 64 KiB each.
//
// A Meter belongs to one answer and is not safe for concurrent use. The
// server may pool meters: Reset readies one for the next answer.
type Meter struct {
	caps meterCaps
	sse  bool

	// A JSON answer: all of it, or once over (past caps.json) a window
	// whose last caps.tail bytes are the answer's last bytes.
	buf  []byte
	over bool

	// An SSE answer.
	line     []byte // the line so far
	skipLine bool   // the line passed caps.line: dropped until its end
	afterCR  bool   // the last byte was '\r': a '\n' next ends no line
	data     []byte // the event's data lines, joined by '\n'
	hasData  bool
	broken   bool // the event lost a line, or its data passed caps.line
	ev       event
	chunks   int64
	usage    usage
	hasUsage bool
}

var _ io.Writer = (*Meter)(nil)

// usage is the part of an answer's usage that settles a request.
type usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// event is the part of a stream chunk the Meter reads.
type event struct {
	Choices []struct {
		Text  hasText `json:"text"`
		Delta struct {
			Content          hasText    `json:"content"`
			ReasoningContent hasText    `json:"reasoning_content"`
			Reasoning        hasText    `json:"reasoning"`
			ToolCalls        []struct{} `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

// hasText is whether a JSON value is a non-empty string, read without
// keeping the string: encoding/json has validated the value, and "" is
// the only empty string's encoding.
type hasText bool

// UnmarshalJSON implements json.Unmarshaler.
func (h *hasText) UnmarshalJSON(b []byte) error {
	*h = len(b) > 2 && b[0] == '"'
	return nil
}

// NewMeter is a Meter for an answer of contentType (its Content-Type
// header).
func NewMeter(contentType string) *Meter {
	m := &Meter{}
	m.Reset(contentType)
	return m
}

// newMeterCaps is NewMeter with other bounds.
func newMeterCaps(contentType string, caps meterCaps) *Meter {
	m := NewMeter(contentType)
	m.caps = caps
	return m
}

// Reset readies m for a new answer of contentType, keeping its buffers
// when they are small.
func (m *Meter) Reset(contentType string) {
	*m = Meter{
		caps: defaultMeterCaps,
		sse:  isEventStream(contentType),
		buf:  keep(m.buf),
		line: keep(m.line),
		data: keep(m.data),
		ev:   event{Choices: m.ev.Choices[:0]},
	}
}

func keep(b []byte) []byte {
	if cap(b) > meterKeepCap {
		return nil
	}
	return b[:0]
}

func isEventStream(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil && !errors.Is(err, mime.ErrInvalidMediaParameter) {
		return false
	}
	return mt == "text/event-stream"
}

// Write takes the next bytes of the answer as they go to the client. It
// never fails and never keeps p.
func (m *Meter) Write(p []byte) (int, error) {
	if m.sse {
		m.writeSSE(p)
	} else {
		m.writeJSON(p)
	}
	return len(p), nil
}

// Used is what the request used: the answer's usage when it has one (a
// JSON answer's, or a stream's last non-null usage), else c.Prompt and
// the content chunks streamed (none for a JSON answer). fromUsage says
// which. Counts below 0 read as 0.
func (m *Meter) Used(c Cost) (prompt, completion int64, fromUsage bool) {
	u, ok := m.answerUsage()
	if !ok {
		return c.Prompt, m.chunks, false
	}
	return max(u.PromptTokens, 0), max(u.CompletionTokens, 0), true
}

func (m *Meter) answerUsage() (usage, bool) {
	if m.sse {
		return m.usage, m.hasUsage
	}
	if !m.over {
		var a struct {
			Usage *usage `json:"usage"`
		}
		if decode(m.buf, &a) && a.Usage != nil {
			return *a.Usage, true
		}
		return usage{}, false
	}
	return tailUsage(m.buf[max(0, len(m.buf)-m.caps.tail):])
}

// decode reads an answer (or one event of it) into v, keeping what
// decoded around fields of the wrong type (encoding/json goes on past an
// UnmarshalTypeError); false when body is not a JSON object. Answers are
// read through structs, unlike requests (see object): the backend writes
// them, not the tenant.
func decode(body []byte, v any) bool {
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return false
	}
	return partial(json.Unmarshal(body, v))
}

// buffered is the bytes m holds, for the tests of its bounds.
func (m *Meter) buffered() (buf, line, data int) { return len(m.buf), len(m.line), len(m.data) }

func (m *Meter) writeJSON(p []byte) {
	if !m.over {
		if len(m.buf)+len(p) <= m.caps.json {
			m.buf = append(m.buf, p...)
			return
		}
		m.over = true
	}
	tail := m.caps.tail
	if len(p) >= tail {
		m.buf = append(m.buf[:0], p[len(p)-tail:]...)
		return
	}
	// Compact at twice the window, so each byte moves O(1) times.
	if len(m.buf)+len(p) > 2*tail {
		kept := tail - len(p)
		m.buf = m.buf[:copy(m.buf, m.buf[len(m.buf)-kept:])]
	}
	m.buf = append(m.buf, p...)
}

// tailUsage finds the top-level usage in the end of a JSON document: a
// "usage" key such that "{" followed by the rest of the document from it
// is a valid JSON object. A nested key leaves unbalanced closing brackets
// behind it, and a match inside a string starts with an escaped quote.
func tailUsage(tail []byte) (usage, bool) {
	key := []byte(`"usage"`)
	end := len(tail)
	for range usageTries {
		i := bytes.LastIndex(tail[:end], key)
		if i < 0 {
			break
		}
		end = i
		if i > 0 && tail[i-1] == '\\' {
			continue
		}
		doc := append([]byte{'{'}, tail[i:]...)
		var a struct {
			Usage *usage `json:"usage"`
		}
		if decode(doc, &a) && a.Usage != nil {
			return *a.Usage, true
		}
	}
	return usage{}, false
}

func (m *Meter) writeSSE(p []byte) {
	for len(p) > 0 {
		if m.afterCR {
			m.afterCR = false
			if p[0] == '\n' {
				p = p[1:]
				continue
			}
		}
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			m.addToLine(p)
			return
		}
		m.addToLine(p[:i])
		m.afterCR = p[i] == '\r'
		m.endLine()
		p = p[i+1:]
	}
}

func (m *Meter) addToLine(p []byte) {
	if m.skipLine {
		return
	}
	if len(m.line)+len(p) > m.caps.line {
		m.skipLine = true
		m.line = m.line[:0]
		return
	}
	m.line = append(m.line, p...)
}

// endLine handles one complete line: a blank line ends the event, a
// "data" field adds to its data, and every other field and comment is
// ignored (the event stream format of the HTML standard).
func (m *Meter) endLine() {
	line := m.line
	m.line = m.line[:0]
	if m.skipLine {
		m.skipLine = false
		m.broken = true
		return
	}
	if len(line) == 0 {
		m.dispatch()
		return
	}
	name, value, _ := bytes.Cut(line, []byte(":"))
	if string(name) != "data" {
		return
	}
	value = bytes.TrimPrefix(value, []byte(" "))
	sep := 0
	if m.hasData {
		sep = 1
	}
	m.hasData = true
	if m.broken || len(m.data)+sep+len(value) > m.caps.line {
		m.broken = true
		return
	}
	if sep == 1 {
		m.data = append(m.data, '\n')
	}
	m.data = append(m.data, value...)
}

func (m *Meter) dispatch() {
	ok := m.hasData && !m.broken
	data := m.data
	m.data, m.hasData, m.broken = m.data[:0], false, false
	if ok && !bytes.Equal(data, []byte("[DONE]")) {
		m.event(data)
	}
}

// event counts one event's choices that carry text (vLLM sends one token
// per such choice: content, reasoning or a tool call's arguments) and
// keeps its usage when not null.
func (m *Meter) event(data []byte) {
	choices := m.ev.Choices[:cap(m.ev.Choices)]
	clear(choices) // encoding/json does not zero a reused element
	m.ev = event{Choices: choices[:0]}
	if !decode(data, &m.ev) {
		return
	}
	for i := range m.ev.Choices {
		c := &m.ev.Choices[i]
		d := &c.Delta
		if c.Text || d.Content || d.ReasoningContent || d.Reasoning || len(d.ToolCalls) > 0 {
			m.chunks++
		}
	}
	if m.ev.Usage != nil {
		m.usage, m.hasUsage = *m.ev.Usage, true
	}
}
