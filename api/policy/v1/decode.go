package v1

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"sigs.k8s.io/yaml"
)

// ErrDecode marks a document that is not a well-formed Policy: bad syntax, a
// wrong type, an unknown field or trailing data. Validation failures are
// ValidationErrors instead.
var ErrDecode = errors.New("policy: decode")

// ErrStaleVersion is returned by CheckVersion for a policy older than the one
// held; the admin API answers it with 409.
var ErrStaleVersion = errors.New("policy: stale version")

// Decode parses a Policy from JSON or YAML (YAML is converted to JSON first,
// so both obey the same field names). Unknown fields, duplicate keys and
// trailing documents are refused, and so, before them, is a schemaVersion
// newer than SchemaVersion (a *SchemaError, wrapping ErrUnsupportedSchema
// as well as ErrDecode). Decode does not validate; call Validate.
func Decode(data []byte) (*Policy, error) {
	if err := singleDocument(data); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDecode, err)
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDecode, err)
	}
	if len(bytes.TrimSpace(js)) == 0 || bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
		return nil, fmt.Errorf("%w: empty document", ErrDecode)
	}
	if err := checkSchema(js); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDecode, err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	var p Policy
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDecode, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: trailing data after the policy object", ErrDecode)
	}
	return &p, nil
}

// DecodeAndValidate decodes data and validates the result.
func DecodeAndValidate(data []byte) (*Policy, error) {
	p, err := Decode(data)
	if err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// CheckVersion refuses next when it is older than current. An equal version
// is accepted (a resync re-pushes the same document).
func CheckVersion(current, next int64) error {
	if next < current {
		return fmt.Errorf("%w: have %d, got %d", ErrStaleVersion, current, next)
	}
	return nil
}

// singleDocument refuses trailing data: a second JSON value after the first
// or a second YAML document (the YAML converter would read only the first).
func singleDocument(data []byte) error {
	trimmed := bytes.TrimLeft(data, " \t\r\n\ufeff")
	if len(trimmed) > 0 && (trimmed[0] == '{' || trimmed[0] == '[') {
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return err
		}
		if _, err := dec.Token(); !errors.Is(err, io.EOF) {
			return errors.New("trailing data after the policy object")
		}
		return nil
	}
	content := false
	for _, line := range bytes.Split(data, []byte("\n")) {
		l := bytes.TrimRight(line, " \t\r")
		if bytes.Equal(l, []byte("---")) || bytes.HasPrefix(l, []byte("--- ")) {
			if content {
				return errors.New("more than one YAML document")
			}
			continue
		}
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			content = true
		}
	}
	return nil
}
