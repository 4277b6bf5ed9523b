package wire

import (
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
)

// SetScope encodes a token scope (its rights must be known: see itx.Scope.Validate).
func SetScope(dst schema.TokenScope, s itx.Scope) error {
	if err := dst.SetPrefix(s.Prefix); err != nil {
		return err
	}
	if len(s.Rights) == 0 {
		return nil
	}
	list, err := dst.NewRights(int32(len(s.Rights)))
	if err != nil {
		return err
	}
	for i, r := range s.Rights {
		list.Set(i, schema.RightFromString(string(r)))
	}
	return nil
}

// ScopeFromSchema decodes a token scope. A right this side does not know (a newer peer's)
// decodes as its ordinal, which Scope.Validate refuses.
func ScopeFromSchema(src schema.TokenScope) (itx.Scope, error) {
	var s itx.Scope
	var err error
	if s.Prefix, err = src.Prefix(); err != nil {
		return s, err
	}
	rights, err := src.Rights()
	if err != nil {
		return s, err
	}
	for i := 0; i < rights.Len(); i++ {
		s.Rights = append(s.Rights, itx.Right(rights.At(i).String()))
	}
	return s, nil
}

// SetTokenInfo encodes a token's description (never the token).
func SetTokenInfo(dst schema.TokenInfo, t itx.TokenInfo) error {
	dst.SetCreatedAt(t.CreatedAt)
	dst.SetLastUsedAt(t.LastUsedAt)
	dst.SetExpiresAt(t.ExpiresAt)
	if err := setTexts(field{dst.SetId, t.ID}, field{dst.SetProjectId, t.ProjectID}, field{dst.SetLabel, t.Label}); err != nil {
		return err
	}
	sc, err := dst.NewScope()
	if err != nil {
		return err
	}
	return SetScope(sc, t.Scope)
}

// TokenInfoFromSchema decodes a token's description.
func TokenInfoFromSchema(src schema.TokenInfo) (itx.TokenInfo, error) {
	t := itx.TokenInfo{CreatedAt: src.CreatedAt(), LastUsedAt: src.LastUsedAt(), ExpiresAt: src.ExpiresAt()}
	var err error
	if t.ID, err = src.Id(); err != nil {
		return t, err
	}
	if t.ProjectID, err = src.ProjectId(); err != nil {
		return t, err
	}
	if t.Label, err = src.Label(); err != nil {
		return t, err
	}
	if src.HasScope() {
		sc, err := src.Scope()
		if err != nil {
			return t, err
		}
		if t.Scope, err = ScopeFromSchema(sc); err != nil {
			return t, err
		}
	}
	return t, nil
}

// SetProjectSummary encodes a row of the administration's project list.
func SetProjectSummary(dst schema.ProjectSummary, p itx.ProjectSummary) error {
	dst.SetCreatedAt(p.CreatedAt)
	dst.SetStreamCount(uint32(p.StreamCount))
	info, err := dst.NewInfo()
	if err != nil {
		return err
	}
	return SetProjectInfo(info, p.Info)
}

// ProjectSummaryFromSchema decodes a row of the administration's project list.
func ProjectSummaryFromSchema(src schema.ProjectSummary) (itx.ProjectSummary, error) {
	p := itx.ProjectSummary{CreatedAt: src.CreatedAt(), StreamCount: int(src.StreamCount())}
	info, err := src.Info()
	if err != nil {
		return p, err
	}
	p.Info, err = ProjectInfoFromSchema(info)
	return p, err
}
