package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/storeguard/storeguard/storeinfo"
)

// newIdentifyCommand asks a store which generation and backend it speaks, with the probes serve
// uses in auto mode (storeinfo.Learn): safe against any release, legacy stores included.
func newIdentifyCommand() *cobra.Command {
	var target string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "identify --target HOST:PORT",
		Short: "Tell the protocol generation and backend of the TCPStore at HOST:PORT (harmless to any release)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if target == "" {
				return fmt.Errorf("--target: required")
			}
			info, err := storeinfo.Learn(context.Background(), target, timeout)
			if err != nil {
				return fmt.Errorf("%s: %w", target, err)
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]string{
				"target": target, "generation": info.Gen.String(), "backend": info.Backend.String()})
		},
	}
	cmd.Flags().StringVar(&target, "target", "", "the store's address, HOST:PORT")
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "how long each probe waits for an answer")
	return cmd
}
