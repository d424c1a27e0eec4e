package sendgrid

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits on what of an answer is kept in a Result.
const (
	maxKeptErrors    = 10  // items of SendGrid's "errors" array
	maxKeptBodyBytes = 512 // of a body that is not SendGrid's error JSON, and of each message
	maxMessageErrors = 3   // items quoted in the error message
)

// APIError is the error of a Result for an answer that is not 2xx: its
// status and SendGrid's "errors" array, with the API key removed wherever
// the peer echoed it. Get it with errors.As.
type APIError struct {
	// StatusCode is SendGrid's HTTP status.
	StatusCode int
	// Errors is SendGrid's "errors" array (at most 10 items), empty when the
	// body was not SendGrid's error JSON.
	Errors []ErrorItem
	// Body is the start of a body that was not SendGrid's error JSON (at
	// most 512 bytes), for a proxy's or load balancer's answer.
	Body string
}

// ErrorItem is one item of SendGrid's "errors" array.
type ErrorItem struct {
	// Message says what is wrong ("The from email does not contain a valid
	// address.").
	Message string `json:"message,omitempty"`
	// Field names the request field at fault ("from.email"), when one is.
	Field string `json:"field,omitempty"`
	// Help is SendGrid's pointer to documentation, a string or an object.
	Help any `json:"help,omitempty"`
}

// Error describes the status and SendGrid's first messages.
func (e *APIError) Error() string {
	var b strings.Builder
	b.WriteString("sendgrid answered ")
	b.WriteString(strconv.Itoa(e.StatusCode))
	if text := http.StatusText(e.StatusCode); text != "" {
		b.WriteString(" " + text)
	}
	for i, item := range e.Errors {
		if i == maxMessageErrors {
			b.WriteString("; …")
			break
		}
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(item.Message)
		if item.Field != "" {
			b.WriteString(" (" + item.Field + ")")
		}
	}
	return b.String()
}

// detail is the JSON kept as a Result's Detail: {"status", "errors"} or
// {"status", "body"}.
func (e *APIError) detail() json.RawMessage {
	d := struct {
		Status int         `json:"status"`
		Errors []ErrorItem `json:"errors,omitempty"`
		Body   string      `json:"body,omitempty"`
	}{e.StatusCode, e.Errors, e.Body}
	out, err := json.Marshal(d)
	if err != nil { // a Help value json cannot encode again: keep the rest
		d.Errors = nil
		out, _ = json.Marshal(d)
	}
	return out
}

// parseAnswer reads a non-2xx answer's body, passing every string through
// redact.
func parseAnswer(status int, body string, redact func(string) string) *APIError {
	e := &APIError{StatusCode: status}
	var answer struct {
		Errors []ErrorItem `json:"errors"`
	}
	dec := json.NewDecoder(strings.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&answer); err == nil && len(answer.Errors) > 0 {
		if len(answer.Errors) > maxKeptErrors {
			answer.Errors = answer.Errors[:maxKeptErrors]
		}
		for _, item := range answer.Errors {
			e.Errors = append(e.Errors, ErrorItem{
				Message: truncate(redact(item.Message), maxKeptBodyBytes),
				Field:   truncate(redact(item.Field), maxKeptBodyBytes),
				Help:    redactValue(item.Help, redact),
			})
		}
		return e
	}
	if text := bytes.TrimSpace([]byte(body)); len(text) > 0 {
		// Redact, then cut: a cut first could leave half a key.
		e.Body = truncate(redact(string(text)), maxKeptBodyBytes)
	}
	return e
}

// redactValue applies redact to every string, object key included, of a
// decoded JSON value.
func redactValue(v any, redact func(string) string) any {
	switch v := v.(type) {
	case string:
		return redact(v)
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = redactValue(x, redact)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[redact(k)] = redactValue(x, redact)
		}
		return out
	}
	return v // json.Number, bool, nil
}

// truncate cuts s to at most n bytes on a rune boundary. Redact before
// cutting, never after: a key cut in half would not be found.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
