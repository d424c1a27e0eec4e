package sendgrid_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"testing"

	sgmail "github.com/sendgrid/sendgrid-go/helpers/mail"

	"github.com/sidefx/sidefx/providers/sendgrid"
	"github.com/sidefx/sidefx/providers/sendgrid/internal/mail"
	"github.com/sidefx/sidefx/providers/sendgrid/sendgridcheck"
)

// The copy of sendgrid-go's mail types that the light check decodes into
// has the same type names, fields, types and JSON tags: a payload decodes,
// fails to decode (json's errors name the types) and encodes as it does
// with sendgrid-go's own.
func TestMailCopy_IsSendGridGos(t *testing.T) {
	t.Parallel()
	sameType(t, "SGMailV3", reflect.TypeFor[mail.SGMailV3](), reflect.TypeFor[sgmail.SGMailV3](), map[reflect.Type]bool{})
}

func sameType(t *testing.T, at string, ours, theirs reflect.Type, seen map[reflect.Type]bool) {
	t.Helper()
	if ours.Kind() != theirs.Kind() || ours.Name() != theirs.Name() || ours.String() != theirs.String() {
		t.Fatalf("%s: type %s (%s), sendgrid-go's is %s (%s)", at, ours, ours.Kind(), theirs, theirs.Kind())
	}
	if seen[ours] {
		return
	}
	seen[ours] = true
	if ours.Implements(reflect.TypeFor[json.Unmarshaler]()) != theirs.Implements(reflect.TypeFor[json.Unmarshaler]()) ||
		ours.Implements(reflect.TypeFor[json.Marshaler]()) != theirs.Implements(reflect.TypeFor[json.Marshaler]()) {
		t.Fatalf("%s: JSON methods differ", at)
	}
	switch ours.Kind() {
	case reflect.Pointer, reflect.Slice:
		sameType(t, at+"[]", ours.Elem(), theirs.Elem(), seen)
	case reflect.Map:
		sameType(t, at+"{key}", ours.Key(), theirs.Key(), seen)
		sameType(t, at+"{}", ours.Elem(), theirs.Elem(), seen)
	case reflect.Struct:
		if ours.NumField() != theirs.NumField() {
			t.Fatalf("%s: %d fields, sendgrid-go's has %d", at, ours.NumField(), theirs.NumField())
		}
		for i := range ours.NumField() {
			o, s := ours.Field(i), theirs.Field(i)
			if o.Name != s.Name || o.Tag != s.Tag || o.Anonymous != s.Anonymous {
				t.Fatalf("%s: field %d is %s `%s`, sendgrid-go's is %s `%s`", at, i, o.Name, o.Tag, s.Name, s.Tag)
			}
			sameType(t, at+"."+o.Name, o.Type, s.Type, seen)
		}
	}
}

// sendgridGoDecode is the provider's decode before the light check: into
// sendgrid-go's SGMailV3.
func sendgridGoDecode(payload []byte) (*sgmail.SGMailV3, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	var m *sgmail.SGMailV3
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after")
	}
	return m, nil
}

// The light check and the provider's agree on every payload of the table,
// word for word; json's own errors are those decoding into sendgrid-go's
// types gives; and a mail the check accepts encodes as sendgrid-go's does.
func TestSendGridCheck_AgreesWithTheProvider(t *testing.T) {
	t.Parallel()
	payloads := []struct {
		payload string
		ok      bool
	}{
		{validPayload, true},
		{`{"personalizations":[{"to":[{"email":"a@example.com"}],"dynamic_template_data":{"n":12345678901234567890}}],"from":{"email":"s@example.com"},"template_id":"d-1","send_at":5,"asm":{"group_id":3,"groups_to_display":[1,2]},"mail_settings":{"sandbox_mode":{"enable":true}},"tracking_settings":{"ganalytics":{"enable":false,"utm_source":"x"}}}`, true},
		{`{"personalizations":[{"to":[{"email":"a@example.com"}]}],"from":{"email":"s@example.com"},"content":[{"type":"text/plain","value":"hi"}],"attachments":[{"content":"aGk=","filename":"a.txt"}],"reply_to_list":[{"email":"r@example.com"}]}`, true},
		{``, false},
		{`null`, false},
		{`[]`, false},
		{`"mail"`, false},
		{`{"subject": "no recipients"}`, false},
		{`{"personalisations":[{"to":[{"email":"a@example.com"}]}],"from":{"email":"s@example.com"},"content":[{"type":"text/plain","value":"hi"}]}`, false},
		{`{"personalizations":{"to":[]},"from":{"email":"s@example.com"}}`, false},
		{`{"personalizations":[{"to":"a@example.com"}],"from":{"email":"s@example.com"}}`, false},
		{`{"personalizations":[{"to":[{"email":"a@example.com"}],"send_at":"soon"}],"from":{"email":"s@example.com"},"template_id":"d-1"}`, false},
		{`{"personalizations":[{"to":[{"email":"a@example.com"}],"send_at":1.5}],"from":{"email":"s@example.com"},"template_id":"d-1"}`, false},
		{`{"personalizations":[{"to":[{"email":"a@example.com"}]}],"from":{"email":"s@example.com"},"asm":{"group_id":1,"groups_to_display":["x"]},"template_id":"d-1"}`, false},
		{`{"personalizations":[{"to":[{"email":"a@example.com"}]}],"from":{"email":"s@example.com"},"mail_settings":{"footer":{"enable":"yes"}},"template_id":"d-1"}`, false},
		{`{"personalizations":[null],"from":{"email":"s@example.com"},"template_id":"d-1"}`, false},
		{`{"personalizations":[{"to":[]}],"from":{"email":"s@example.com"},"template_id":"d-1"}`, false},
		{`{"personalizations":[{"to":[{"email":"a@example.com"}],"cc":[null]}],"from":{"email":"s@example.com"},"template_id":"d-1"}`, false},
		{`{"personalizations":[{"to":[{"email":"a@example.com"}]}],"from":{"name":"no address"},"template_id":"d-1"}`, false},
		{`{"personalizations":[{"to":[{"email":"a@example.com"}]}],"from":{"email":"s@example.com"}}`, false},
		{`{"personalizations":[{"to":[{"email":"a@example.com"}]}],"from":{"email":"s@example.com"},"content":[{"type":"text/plain"}]}`, false},
		{`{"personalizations":[{"to":[{"email":"a@example.com"}]}],"from":{"email":"s@example.com"},"template_id":"d-1","attachments":[{"content":"aGk="}]}`, false},
		{`{"personalizations":[{"to":[{"email":"a@example.com"}]}],"from":{"email":"s@example.com"},"template_id":"d-1"} {}`, false},
	}
	for _, name := range []string{"", "receipts"} {
		p, err := sendgrid.New(&sendgrid.Config{APIKey: testKey, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		for _, tc := range payloads {
			light := sendgridcheck.CheckPayload(name, json.RawMessage(tc.payload))
			theirs := p.CheckPayload("email.receipt", json.RawMessage(tc.payload))
			if (light == nil) != tc.ok || (theirs == nil) != tc.ok {
				t.Errorf("%s: light check %v, provider's %v, want ok %v", tc.payload, light, theirs, tc.ok)
				continue
			}
			if light != nil && (light.Error() != theirs.Error() || !errors.Is(light, sendgrid.ErrBadPayload)) {
				t.Errorf("%s: light check %q, provider's %q", tc.payload, light, theirs)
			}
			ours, oerr := mail.Decode([]byte(tc.payload))
			sg, serr := sendgridGoDecode([]byte(tc.payload))
			var syntax *json.SyntaxError
			var typeErr *json.UnmarshalTypeError
			if errors.As(serr, &syntax) || errors.As(serr, &typeErr) || (serr != nil && bytes.Contains([]byte(serr.Error()), []byte("unknown field"))) {
				if oerr == nil || oerr.Error() != "decode: "+serr.Error() {
					t.Errorf("%s: decode %v, into sendgrid-go's types %v", tc.payload, oerr, serr)
				}
			}
			if oerr == nil && serr == nil && sg != nil {
				ob, _ := json.Marshal(ours)
				sb, _ := json.Marshal(sg)
				if !bytes.Equal(ob, sb) {
					t.Errorf("%s: encodes as\n%s\nsendgrid-go's as\n%s", tc.payload, ob, sb)
				}
			}
		}
	}
}
