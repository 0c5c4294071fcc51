package api

import (
	"context"
	"net/http"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/webhooks"
)

// Completers of the caller's tenant (scope tenant:admin): the resume
// endpoints the completer calls for the tenant's orphans (completer.go,
// web/docs/worker-dies). Their URLs follow the webhook endpoints' rules,
// and the secret is shown once, in the answer of the create.

// completerJSON is a completer as the API shows it; Secret only on create.
type completerJSON struct {
	ID               string    `json:"id"`
	URL              string    `json:"url"`
	OperationPattern string    `json:"operation_pattern"`
	CreatedAt        time.Time `json:"created_at"`
	Secret           string    `json:"secret,omitempty"`
}

func encodeCompleter(c idem.Completer) completerJSON {
	return completerJSON{ID: c.ID, URL: c.URL, OperationPattern: c.OperationPattern, CreatedAt: c.CreatedAt}
}

// createCompleterRequest is the body of POST /v1/completers.
type createCompleterRequest struct {
	URL              string `json:"url"`
	OperationPattern string `json:"operation_pattern"`
}

func (s *service) createCompleter(ctx context.Context, req *createCompleterRequest) (reply, error) {
	c, err := webhooks.NewCompleter(tenantFrom(ctx).ID, req.URL, req.OperationPattern, s.allowPrivateWebhooks)
	if err != nil {
		return reply{}, err
	}
	c, err = s.completers.CreateCompleter(ctx, c)
	return answerCreated(c, err, "create completer", encodeNewCompleter)
}

// encodeNewCompleter is a created completer: its secret is shown this once.
func encodeNewCompleter(c idem.Completer) completerJSON {
	out := encodeCompleter(c)
	out.Secret = c.Secret
	return out
}

func (s *service) listCompleters(ctx context.Context, _ *emptyRequest) (listJSON[completerJSON], error) {
	cs, err := s.completers.ListCompleters(ctx, idem.ListCompletersParams{TenantID: tenantFrom(ctx).ID})
	return answerList(cs, err, "list completers", encodeCompleter)
}

// completerParam is the {id} of /v1/completers/{id}.
type completerParam struct{ id string }

func (p *completerParam) bind(r *http.Request) (err error) {
	p.id, err = bindID(r, "completer")
	return err
}

type getCompleterRequest struct {
	completerParam `json:"-"`
}

func (s *service) getCompleter(ctx context.Context, req *getCompleterRequest) (completerJSON, error) {
	c, err := s.completers.GetCompleter(ctx, idem.GetCompleterParams{TenantID: tenantFrom(ctx).ID, ID: req.id})
	return answer(c, err, "get completer", encodeCompleter)
}

type deleteCompleterRequest struct {
	completerParam `json:"-"`
}

func (s *service) deleteCompleter(ctx context.Context, req *deleteCompleterRequest) (noContent, error) {
	err := s.completers.DeleteCompleter(ctx, idem.DeleteCompleterParams{TenantID: tenantFrom(ctx).ID, ID: req.id})
	return answerDone(err, "delete completer")
}
