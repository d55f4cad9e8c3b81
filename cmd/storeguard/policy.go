package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/policy"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/replay"
)

// newPolicyCommand returns `policy`, holding `learn` and `check`.
func newPolicyCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Learn a policy file from a clean job's capture, check one, or judge values (docs/policy.md)",
	}
	cmd.AddCommand(newPolicyLearnCommand(), newPolicyCheckCommand(), newPolicyJudgeCommand(), newPolicyAllowedCommand())
	return cmd
}

func newPolicyLearnCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "learn [flags] CAPTURE...",
		Short: "Write a starting policy file from a clean job's captures (pcap, pcapng, gzip)",
		Long: "Replays the captures as `storeguard replay` does, with the configuration's default rules\n" +
			"(a policy file in it is not applied), and learns from every message that breaks no rule:\n" +
			"per key pattern (each run of digits a *) the ops used and the kind and largest size of\n" +
			"the values written (pickles with the globals they import), and the ops without a key.\n" +
			"Prints a policy file (or writes it to --out): a value rule and an allow rule per pattern,\n" +
			"then `not-learned`, every other op on any key denied in monitor mode. Review it, run it\n" +
			"in monitor mode (policy.file) until the audit log shows nothing of the job's own as\n" +
			"would_block, then enforce.\n\n" +
			"Audit logs cannot be learned from: they hold no key of the traffic that passed.\n\n" +
			"Exit status: 0 learned, 1 learned but some streams broke a rule or could not be decoded\n" +
			"(the capture may not be clean; what they sent was not all learned), 2 error.",
		Args:         cobra.MinimumNArgs(1),
		SilenceUsage: true,
	}
	d := config.Default()
	fs := cmd.Flags()
	fs.String("config", "", "YAML config file (also $STOREGUARD_CONFIG): limits, policy.*, replay.ports")
	fs.String("generation", d.Generation, "store generation: auto | G0..G6 | torch release MAJOR.MINOR")
	fs.IntSlice("ports", nil, "TCPStore server ports, comma-separated or repeated (default: config replay.ports, 29500)")
	fs.StringP("out", "o", "", "write the policy file here instead of stdout")
	cmd.RunE = func(cmd *cobra.Command, files []string) error {
		cfg, err := config.Load(loadOptions(fs))
		if err != nil {
			return fmt.Errorf("bad configuration:\n%w", err)
		}
		learner := policy.NewLearner()
		var opts replay.Options
		if opts.Rules, err = learningRules(cfg, learner); err != nil {
			return err
		}
		ports, _ := fs.GetIntSlice("ports")
		for _, p := range ports {
			if p < 1 || p > 65535 {
				return fmt.Errorf("--ports %d: must be between 1 and 65535", p)
			}
			opts.Ports = append(opts.Ports, uint16(p))
		}
		sum, err := replayFiles(cmd, cfg, files, opts)
		if err != nil {
			return exitError{2, err}
		}
		b, err := learner.YAML(learnedHeader(files, sum, learner.Stats()))
		if err != nil {
			return exitError{2, err}
		}
		out, _ := fs.GetString("out")
		if out == "" {
			_, err = cmd.OutOrStdout().Write(b)
		} else {
			err = os.WriteFile(out, b, 0o644)
		}
		if err != nil {
			return exitError{2, err}
		}
		st := learner.Stats()
		wrote := ""
		if out != "" {
			wrote = "; wrote " + out
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "learned: %d key patterns, from %d messages in %d streams%s\n",
			st.Patterns, st.Messages-st.Skipped, sum.Streams, wrote)
		if sum.Reject > 0 || sum.Incomplete > 0 {
			return exitError{1, fmt.Errorf("not a clean capture: %s; see `storeguard replay` for which streams", sum)}
		}
		return nil
	}
	return cmd
}

// learningRules is cfg's policy stage without its policy file (the file's rules would keep what
// they stop or record from being learned), with learner fed every message.
func learningRules(cfg config.Config, learner *policy.Learner) (*policy.Policy, error) {
	p, err := cfg.Rules()
	if err != nil {
		return nil, err
	}
	var pc policy.Config // every rule off, as cfg.Rules says when it returns nil
	if p != nil {
		pc = p.Config()
	}
	pc.Rules, pc.Learn = nil, learner
	return policy.New(pc)
}

// learnedHeader is the comment at the top of a learned policy file.
func learnedHeader(files []string, sum replay.Summary, st policy.LearnStats) string {
	names := make([]string, len(files))
	for i, f := range files {
		names[i] = filepath.Base(f)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Learned by `storeguard policy learn` from %s:\n", strings.Join(names, ", "))
	fmt.Fprintf(&b, "Messages learned: %d, in %d streams; key patterns: %d.\n", st.Messages-st.Skipped, sum.Streams, st.Patterns)
	if st.Skipped > 0 || sum.Reject > 0 || sum.Incomplete > 0 {
		fmt.Fprintf(&b, "NOT A CLEAN CAPTURE: messages that broke a rule, not learned: %d; streams rejected (what they\n"+
			"sent after the violation was not read): %d; streams not decoded (no SYN, or gaps): %d.\n",
			st.Skipped, sum.Reject, sum.Incomplete)
	}
	b.WriteString("The most specific key patterns come first: keep that order, the first rule that matches a key\n" +
		"decides for it.\n")
	b.WriteString("A starting point, not a verdict: review every rule before enforcing it. Run it first as it\n" +
		"is (policy.file; the last rule, not-learned, only records), read the audit log's would_block\n" +
		"events, then set not-learned's mode to enforce. docs/policy.md, \"Learning a policy\".\n")
	return b.String()
}

func newPolicyCheckCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "check FILE",
		Short: "Validate a policy file",
		Long: "Reads FILE as policy.file reads it and compiles its rules. A problem is named by the file,\n" +
			"the rule's index and name and the key that is wrong. Exit status: 0 valid, 2 not.",
		Args:         cobra.ExactArgs(1),
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			rules, err := policy.LoadFile(args[0])
			if err == nil {
				// LoadFile judges each rule alone; New also finds a name used twice.
				if _, err = policy.New(policy.Config{Rules: rules}); err != nil {
					err = fmt.Errorf("%s: %w", args[0], err)
				}
			}
			if err != nil {
				return exitError{2, err}
			}
			out := bufio.NewWriter(cmd.OutOrStdout())
			fmt.Fprintf(out, "%s: %d rules\n", args[0], len(rules))
			for i, r := range rules {
				fmt.Fprintf(out, "  [%d] %s: %s", i, r.Name, r.Action)
				if r.Value != nil {
					fmt.Fprintf(out, " %s", r.Value.Kind)
				}
				if r.Mode == "monitor" {
					fmt.Fprint(out, " (monitor)")
				}
				fmt.Fprintf(out, " %s\n", ruleScope(r))
			}
			return out.Flush()
		},
	}
}

// ruleScope says what a rule matches, briefly.
func ruleScope(r policy.Rule) string {
	var parts []string
	keys := "every key or none"
	if len(r.Keys) > 0 {
		shown := make([]string, len(r.Keys))
		for i, k := range r.Keys {
			shown[i] = protocol.ShowKey([]byte(k))
		}
		keys = strings.Join(shown, " ")
	}
	parts = append(parts, "keys "+keys)
	if len(r.Ops) > 0 {
		parts = append(parts, "ops "+strings.Join(r.Ops, ","))
	}
	if len(r.Sources) > 0 {
		parts = append(parts, "from "+strings.Join(r.Sources, ","))
	}
	return strings.Join(parts, "; ")
}

func newPolicyJudgeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "judge [flags] FILE",
		Short: "Judge values as the policy stage would judge a SET of each (JSON lines in, JSON lines out)",
		Long: "Reads FILE (- for stdin), one JSON object a line: {\"value\": HEX} or {\"text\": STRING},\n" +
			"with an optional \"key\" (default --key). Judges each as a SET of that key through the\n" +
			"configuration's value rules (its policy file, the rendezvous state rule, the pickle rule;\n" +
			"not write-once or the quota, which depend on the store) and prints one JSON object a line:\n" +
			"the input's other fields, and \"verdict\" (pass, blocked or would_block), \"rule\", \"detail\".\n" +
			"Nothing is unpickled. Exit status: 0 judged, 2 a line is not such an object (named).",
		Args:         cobra.ExactArgs(1),
		SilenceUsage: true,
	}
	fs := cmd.Flags()
	fs.String("config", "", "YAML config file (also $STOREGUARD_CONFIG): policy.*")
	fs.String("key", "/storeguard/judge", "the key of a line without one")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		cfg, err := config.Load(loadOptions(fs))
		if err != nil {
			return fmt.Errorf("bad configuration:\n%w", err)
		}
		p, err := cfg.Rules()
		if err != nil {
			return exitError{2, err}
		}
		in := cmd.InOrStdin()
		if args[0] != "-" {
			f, err := os.Open(args[0])
			if err != nil {
				return exitError{2, err}
			}
			defer f.Close()
			in = f
		}
		defKey, _ := fs.GetString("key")
		return judgeLines(in, cmd.OutOrStdout(), p, defKey)
	}
	return cmd
}

// judgeLines judges each JSON line of in (see `policy judge`) and writes its verdict to out.
func judgeLines(in io.Reader, out io.Writer, p *policy.Policy, defKey string) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 1<<20), 256<<20)
	w := bufio.NewWriter(out)
	enc := json.NewEncoder(w)
	for n := 1; sc.Scan(); n++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return exitError{2, fmt.Errorf("line %d: not a JSON object: %w", n, err)}
		}
		value, err := judgedValue(rec)
		if err != nil {
			return exitError{2, fmt.Errorf("line %d: %w", n, err)}
		}
		key := defKey
		if k, ok := rec["key"].(string); ok {
			key = k
		}
		delete(rec, "value")
		rec["verdict"] = "pass"
		if f, broke := p.JudgeValue([]byte(key), value, netip.IPv4Unspecified()); broke {
			rec["verdict"], rec["rule"], rec["detail"] = "blocked", string(f.Rule), f.Detail
			if f.Mode == policy.Monitor {
				rec["verdict"] = "would_block"
			}
		}
		if err := enc.Encode(rec); err != nil {
			return exitError{2, err}
		}
	}
	if err := sc.Err(); err != nil {
		return exitError{2, err}
	}
	return w.Flush()
}

// judgedValue is a judge line's value: "value" in hex, or "text".
func judgedValue(rec map[string]any) ([]byte, error) {
	if h, ok := rec["value"].(string); ok {
		b, err := hex.DecodeString(h)
		if err != nil {
			return nil, fmt.Errorf("value: not hex: %w", err)
		}
		return b, nil
	}
	if t, ok := rec["text"].(string); ok {
		return []byte(t), nil
	}
	return nil, errors.New(`no "value" (hex) or "text" (a string)`)
}

func newPolicyAllowedCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "allowed",
		Short: "Print the default pickle allow-list: the globals a pickle may import and call on any key",
		Long: "One module.name a line: what builds the data torch and the frameworks write (measured on every\n" +
			"release; docs/policy.md). A policy file's value.globals add to it for their keys; the deny\n" +
			"list (policy.deny-globals and the built-in one) is never lifted.",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := bufio.NewWriter(cmd.OutOrStdout())
			for _, g := range policy.AllowedGlobals() {
				fmt.Fprintln(w, g)
			}
			return w.Flush()
		},
	}
}
