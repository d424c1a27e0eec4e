package sendgrid

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/sendgrid/internal/mail"
)

// maxKeyLen bounds a call's key; derived keys are far shorter.
const maxKeyLen = 255

// buildBody reads c.Payload as a mail, checks it (as sendgridcheck does),
// tags it with c's key, and returns the request body. Its errors wrap
// ErrBadPayload, except one for a call without a usable key.
func buildBody(c providers.Call) ([]byte, error) {
	if err := checkKey(c.Key); err != nil {
		return nil, err
	}
	m, err := mail.Decode(c.Payload)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadPayload, err)
	}
	if err := mail.Check(m); err != nil {
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
