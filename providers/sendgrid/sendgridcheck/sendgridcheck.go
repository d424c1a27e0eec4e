package sendgridcheck

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sidefx/sidefx/providers/sendgrid/internal/mail"
)

// DefaultName is the name of a SendGrid provider that sets none.
const DefaultName = "sendgrid"

// ErrBadPayload is wrapped by every error Check returns: the payload is not
// a mail the provider can send. sendgrid.ErrBadPayload is the same error.
var ErrBadPayload = errors.New("invalid sendgrid mail payload")

// Check checks payload as a v3 mail-send body, as the SendGrid provider does
// before any request: one JSON object of the shape of sendgrid-go's
// mail.SGMailV3, no field it does not know, with what every mail needs.
// The error wraps ErrBadPayload and names what is wrong.
func Check(payload json.RawMessage) error {
	m, err := mail.Decode(payload)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadPayload, err)
	}
	if err := mail.Check(m); err != nil {
		return fmt.Errorf("%w: %w", ErrBadPayload, err)
	}
	return nil
}

// CheckPayload is Check with the words the SendGrid provider named name
// puts before its errors ("sendgrid mail send: …"): the error its
// CheckPayload returns for payload.
func CheckPayload(name string, payload json.RawMessage) error {
	if err := Check(payload); err != nil {
		return fmt.Errorf("%s: %w", CallName(name), err)
	}
	return nil
}

// CallName is how the SendGrid provider named name ("" is DefaultName)
// names its call in errors.
func CallName(name string) string {
	if name == "" || name == DefaultName {
		return "sendgrid mail send"
	}
	return name + ": sendgrid mail send"
}
