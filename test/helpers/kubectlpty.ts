/**
 * kubectl under a pseudo-terminal (node-pty), so that `exec -t` gets a TTY: types `typed` once its output matches
 * `until`, and resolves with everything it printed and its exit code; killed after timeoutMs. The kubectl binary
 * comes from scripts/install-kubetools.sh (.cache/kubetools/).
 */
import * as nodePty from 'node-pty';

export interface KubectlPtyOptions {
  kubectl: string;
  kubeconfig: string;
  home: string;
  typed: string;
  until: RegExp;
  env?: Record<string, string>;
  timeoutMs?: number;
}

export function kubectlPty(args: string[], o: KubectlPtyOptions): Promise<{ output: string; code: number }> {
  return new Promise((resolve) => {
    const env = { PATH: process.env.PATH ?? '', HOME: o.home, TERM: 'xterm', ...o.env };
    const pty = nodePty.spawn(o.kubectl, ['--kubeconfig', o.kubeconfig, ...args], { cols: 100, rows: 30, env });
    let output = '';
    let typedYet = false;
    pty.onData((d) => {
      output += d;
      if (!typedYet && o.until.test(output)) {
        typedYet = true;
        pty.write(o.typed);
      }
    });
    const kill = setTimeout(() => pty.kill(), o.timeoutMs ?? 30_000);
    pty.onExit(({ exitCode }) => {
      clearTimeout(kill);
      resolve({ output, code: exitCode });
    });
  });
}
