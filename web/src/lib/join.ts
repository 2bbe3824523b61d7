/**
 * The command line that joins an agent (or a Proxy) with a new token, written exactly as `gwctl tokens add`
 * (src/cli/gwctl.ts) prints it, so that the Web UI and the CLI never tell a user two different things. --proxy is
 * the Proxy's public address as ping answers it (proxy.ssh.public_addr), never the host the browser reached the
 * page at; '<proxy-host>:443' as in the CLI when it is unknown.
 */
import type { TokenCreated } from '../types.js';

export function joinCommand(token: TokenCreated, proxyAddr: string | undefined): string {
  const roles = token.roles.join(',');
  const pin = token.ca_pin ?? '<pin>';
  return token.roles.includes('proxy')
    ? `gateway start --data-dir=/var/lib/gateway-proxy --roles=${roles} --auth-server=<auth-host>:3025 --token=${token.token} --ca-pin=${pin}`
    : `gateway start -c /etc/gateway.yaml --data-dir=/var/lib/gateway-agent --roles=${roles} --token=${token.token} --ca-pin=${pin} --proxy=${proxyAddr || '<proxy-host>:443'}`;
}

