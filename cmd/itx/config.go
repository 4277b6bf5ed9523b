package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// defaultAddr is where `make run` (and itxd without --listen) serves.
const defaultAddr = "127.0.0.1:7878"

// defaultDataDir is itxd's default data directory: `make run` then `itx` in the repository
// logs in with the token itxd recorded there.
const defaultDataDir = ".itx-data"

// fileConfig is the config file, $XDG_CONFIG_HOME/itx/config.json (or ~/.config/itx/config.json).
type fileConfig struct {
	Addr  string `json:"addr"`
	Token string `json:"token"`
}

// credentials is the part of itxd's <data>/credentials.json that itx reads. It is copied from
// server.Credentials rather than imported, so the client does not link the server (and SQLite).
type credentials struct {
	ProjectToken    string `json:"projectToken"`
	DeploymentToken string `json:"deploymentToken"` // itx admin uses it when no token is given
	Addr            string `json:"addr"`            // where itxd last listened (recorded by itxd at start)
}

// resolved is where to connect, with where each value came from (shown in the banner).
type resolved struct {
	addr, addrFrom   string
	token, tokenFrom string
	// deploymentToken is the local data directory's deployment root token (itx admin), when
	// the token was taken from that directory too.
	deploymentToken string
}

// tokenHint is what an unauthenticated answer adds when the token was read from a data
// directory's credentials.json: that token may have been revoked since itxd recorded it (a
// rotation), and "unknown token" alone sent the operator looking elsewhere. deployment: the
// deployment root's token was used.
func (r resolved) tokenHint(deployment bool) string {
	if !strings.HasSuffix(r.tokenFrom, "credentials.json") {
		return ""
	}
	if deployment && r.deploymentToken != "" {
		return "the deployment token read from " + r.tokenFrom + ": revoked since? pass --token, or with itxd stopped make a new one with itxd --new-deployment-token"
	}
	return "the token read from " + r.tokenFrom + ": revoked since? pass --token"
}

// settings are the flag values resolution starts from; empty means not given.
type settings struct {
	addr, token, configPath, dataDir string
}

// resolve picks the address and token: flags, then ITX_ADDR / ITX_TOKEN, then the config file,
// then a local itxd's data directory (its credentials.json holds the project token and the
// address itxd last listened on), then (address only) itxd's default listen address. A data
// directory named by --data beats the environment and the config file: it says which server.
func resolve(st settings, getenv func(string) string) (resolved, error) {
	var r resolved
	pick := func(dst, from *string, candidates ...[2]string) {
		for _, c := range candidates {
			if c[0] != "" {
				*dst, *from = c[0], c[1]
				return
			}
		}
	}
	fc, path, err := readConfigFile(st.configPath, getenv)
	if err != nil {
		return r, err
	}
	dataDir := st.dataDir
	if dataDir == "" {
		dataDir = getenv("ITX_DATA")
	}
	if dataDir == "" {
		dataDir = defaultDataDir
	}
	credPath := filepath.Join(dataDir, "credentials.json")
	var creds credentials
	b, err := os.ReadFile(credPath)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &creds); err != nil {
			return r, fmt.Errorf("read %s: %w", credPath, err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return r, fmt.Errorf("read %s: %w", credPath, err)
	}
	explicit := [2]string{}
	if st.dataDir != "" {
		explicit = [2]string{creds.Addr, credPath}
	}
	pick(&r.addr, &r.addrFrom, [2]string{st.addr, "--addr"}, explicit, [2]string{getenv("ITX_ADDR"), "ITX_ADDR"},
		[2]string{fc.Addr, path}, [2]string{creds.Addr, credPath}, [2]string{defaultAddr, "default"})
	if st.dataDir != "" {
		explicit = [2]string{creds.ProjectToken, credPath}
	}
	pick(&r.token, &r.tokenFrom, [2]string{st.token, "--token"}, explicit, [2]string{getenv("ITX_TOKEN"), "ITX_TOKEN"},
		[2]string{fc.Token, path}, [2]string{creds.ProjectToken, credPath})
	if r.tokenFrom == credPath {
		r.deploymentToken = creds.DeploymentToken
	}
	if r.token == "" && dataDir != defaultDataDir && creds == (credentials{}) {
		// --data (or ITX_DATA) named a directory that holds no itxd credentials: say so,
		// rather than list every other place a token may come from.
		return r, fmt.Errorf("no token: %s does not exist (is %s the data directory of an itxd that has started?); or pass --token", credPath, dataDir)
	}
	if r.token == "" {
		return r, errors.New("no token: pass --token, set ITX_TOKEN, write {\"addr\", \"token\"} to " +
			configPathHint(getenv) + ", or run itx where itxd's data directory (.itx-data, or --data) is")
	}
	return r, nil
}

// readConfigFile reads the config file; a missing default file is no error, a missing file
// named by --config or ITX_CONFIG is.
func readConfigFile(explicit string, getenv func(string) string) (fileConfig, string, error) {
	var fc fileConfig
	path := explicit
	if path == "" {
		path = getenv("ITX_CONFIG")
	}
	required := path != ""
	if path == "" {
		path = defaultConfigPath(getenv)
		if path == "" {
			return fc, "", nil
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		if !required && errors.Is(err, fs.ErrNotExist) {
			return fc, path, nil
		}
		return fc, path, fmt.Errorf("read config: %w", err)
	}
	// A misspelt field ("tokn") is refused rather than ignored, which read as "no token".
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fc); err != nil {
		if field, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return fc, path, fmt.Errorf("config %s: unknown field %s (it holds {\"addr\", \"token\"})", path, field)
		}
		return fc, path, fmt.Errorf("read config %s: %w", path, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fc, path, fmt.Errorf("read config %s: something follows its JSON object", path)
	}
	return fc, path, nil
}

func defaultConfigPath(getenv func(string) string) string {
	if dir := getenv("XDG_CONFIG_HOME"); dir != "" {
		return filepath.Join(dir, "itx", "config.json")
	}
	if home := getenv("HOME"); home != "" {
		return filepath.Join(home, ".config", "itx", "config.json")
	}
	return ""
}

func configPathHint(getenv func(string) string) string {
	if p := defaultConfigPath(getenv); p != "" {
		return p
	}
	return "~/.config/itx/config.json"
}

// historyPath is the REPL's history file: ITX_HISTORY, else $XDG_STATE_HOME/itx/history (or
// ~/.local/state/itx/history).
func historyPath(getenv func(string) string) string {
	if p := getenv("ITX_HISTORY"); p != "" {
		return p
	}
	if dir := getenv("XDG_STATE_HOME"); dir != "" {
		return filepath.Join(dir, "itx", "history")
	}
	if home := getenv("HOME"); home != "" {
		return filepath.Join(home, ".local", "state", "itx", "history")
	}
	return ""
}
