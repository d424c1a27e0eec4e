package mail

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// MaxPersonalizations is SendGrid's limit on personalizations in one mail.
const MaxPersonalizations = 1000

// Decode reads a payload into an SGMailV3, refusing fields it does not know
// (a misspelt "personalisations" would otherwise send a mail without them)
// and anything after the object. Numbers are kept as written
// (dynamic_template_data may hold integers beyond float64).
func Decode(payload []byte) (*SGMailV3, error) {
	if len(bytes.TrimSpace(payload)) == 0 {
		return nil, errors.New("the payload is empty")
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	var m *SGMailV3
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("decode: data after the mail object")
	}
	if m == nil {
		return nil, errors.New("the payload is null, not a mail object")
	}
	return m, nil
}

// Check checks what SendGrid requires of every mail and what the provider
// needs to tag it: at least one personalization, each with at least one
// "to"; a "from" address; content or a template; no null in any list.
func Check(m *SGMailV3) error {
	if len(m.Personalizations) == 0 {
		return errors.New(`no personalizations: at least one, with a "to" recipient, is required`)
	}
	if n := len(m.Personalizations); n > MaxPersonalizations {
		return fmt.Errorf("%d personalizations, more than SendGrid's %d", n, MaxPersonalizations)
	}
	for i, p := range m.Personalizations {
		at := fmt.Sprintf("personalizations[%d]", i)
		if p == nil {
			return fmt.Errorf("%s is null", at)
		}
		if len(p.To) == 0 {
			return fmt.Errorf(`%s has no "to" recipient`, at)
		}
		for _, list := range []struct {
			name   string
			emails []*Email
		}{{"to", p.To}, {"cc", p.CC}, {"bcc", p.BCC}} {
			if err := checkEmails(at+"."+list.name, list.emails); err != nil {
				return err
			}
		}
		if p.From != nil && strings.TrimSpace(p.From.Address) == "" {
			return fmt.Errorf("%s.from has no email", at)
		}
	}
	if m.From == nil || strings.TrimSpace(m.From.Address) == "" {
		return errors.New(`no "from" email`)
	}
	if m.ReplyTo != nil && strings.TrimSpace(m.ReplyTo.Address) == "" {
		return errors.New("reply_to has no email")
	}
	if err := checkEmails("reply_to_list", m.ReplyToList); err != nil {
		return err
	}
	for i, c := range m.Content {
		if c == nil || c.Type == "" || c.Value == "" {
			return fmt.Errorf("content[%d] needs a type and a value", i)
		}
	}
	if len(m.Content) == 0 && strings.TrimSpace(m.TemplateID) == "" {
		return errors.New(`neither "content" nor "template_id": the mail has no body`)
	}
	for i, a := range m.Attachments {
		if a == nil || a.Content == "" || a.Filename == "" {
			return fmt.Errorf("attachments[%d] needs a content and a filename", i)
		}
	}
	return nil
}

func checkEmails(at string, emails []*Email) error {
	for i, e := range emails {
		if e == nil || strings.TrimSpace(e.Address) == "" {
			return fmt.Errorf("%s[%d] has no email", at, i)
		}
	}
	return nil
}
