package sendgrid

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/sendgrid/sendgrid-go/helpers/mail"

	"github.com/sidefx/sidefx/providers"
)

// maxPersonalizations is SendGrid's limit on personalizations in one mail.
const maxPersonalizations = 1000

// maxKeyLen bounds a call's key; derived keys are far shorter.
const maxKeyLen = 255

// buildBody reads c.Payload as a mail, checks it, tags it with c's key, and
// returns the request body. Its errors wrap ErrBadPayload, except one for a
// call without a usable key.
func buildBody(c providers.Call) ([]byte, error) {
	if err := checkKey(c.Key); err != nil {
		return nil, err
	}
	m, err := decodeMail(c.Payload)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadPayload, err)
	}
	if err := checkMail(m); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadPayload, err)
	}
	tag(m, c)
	body, err := json.Marshal(m)
	if err != nil { // cannot happen for a decoded mail; refuse rather than guess
		return nil, fmt.Errorf("%w: encode: %w", ErrBadPayload, err)
	}
	return body, nil
}

func checkKey(key string) error {
	if key == "" {
		return errors.New("the call has no key")
	}
	if len(key) > maxKeyLen {
		return fmt.Errorf("the call's key is %d bytes, more than %d", len(key), maxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if key[i] <= ' ' || key[i] >= 0x7f {
			return errors.New("the call's key has a space, control or non-ASCII byte")
		}
	}
	return nil
}

// decodeMail reads a payload into sendgrid-go's mail.SGMailV3, refusing
// fields it does not know (a misspelt "personalisations" would otherwise
// send a mail without them) and anything after the object. Numbers are kept
// as written (dynamic_template_data may hold integers beyond float64).
func decodeMail(payload []byte) (*mail.SGMailV3, error) {
	if len(bytes.TrimSpace(payload)) == 0 {
		return nil, errors.New("the payload is empty")
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	var m *mail.SGMailV3
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

// checkMail checks what SendGrid requires of every mail and what Call needs
// to tag it: at least one personalization, each with at least one "to"; a
// "from" address; content or a template; no null in any list.
func checkMail(m *mail.SGMailV3) error {
	if len(m.Personalizations) == 0 {
		return errors.New(`no personalizations: at least one, with a "to" recipient, is required`)
	}
	if n := len(m.Personalizations); n > maxPersonalizations {
		return fmt.Errorf("%d personalizations, more than SendGrid's %d", n, maxPersonalizations)
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
			emails []*mail.Email
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

func checkEmails(at string, emails []*mail.Email) error {
	for i, e := range emails {
		if e == nil || strings.TrimSpace(e.Address) == "" {
			return fmt.Errorf("%s[%d] has no email", at, i)
		}
	}
	return nil
}

// tag puts c's key, source id and kind into every personalization's
// custom_args, keeping the arguments already there (ours win a clash), and
// the key into the mail header HeaderKey, replacing any header of that name
// in another case.
func tag(m *mail.SGMailV3, c providers.Call) {
	for _, p := range m.Personalizations {
		if p.CustomArgs == nil {
			p.CustomArgs = make(map[string]string, 3)
		}
		p.CustomArgs[ArgKey] = c.Key
		if c.SourceID != "" {
			p.CustomArgs[ArgSourceID] = c.SourceID
		}
		if c.Kind != "" {
			p.CustomArgs[ArgKind] = c.Kind
		}
	}
	if m.Headers == nil {
		m.Headers = make(map[string]string, 1)
	}
	for name := range m.Headers {
		if strings.EqualFold(name, HeaderKey) {
			delete(m.Headers, name)
		}
	}
	m.Headers[HeaderKey] = c.Key
}
