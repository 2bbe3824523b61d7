/**
 * A Proxy's separate listeners for tests' configurations, read from the wire's protocol table
 * (src/wire/protocols.ts) so that a protocol added there is bound by every test that runs proxy_listener_mode
 * separate, without a test listing the keys by hand.
 */
import { listenerRows } from '../../src/wire/protocols.js';

/**
 * The proxy_service keys a separate-mode Proxy binds besides web_listen_addr (which tests set themselves):
 * every listener row's but the web's, and peer_listen_addr (peering's, not a row). Listeners that are off unless
 * set (kube_listen_addr) only with `optional`.
 */
export function separateListenKeys(o: { optional?: boolean } = {}): string[] {
  const rows = listenerRows().filter(({ name, listener }) => name !== 'web' && (o.optional || !listener.off));
  return [...rows.map(({ listener }) => listener.key), 'peer_listen_addr'];
}

/**
 * Those keys as YAML lines of a proxy_service section ("  mysql_listen_addr: 127.0.0.1:0"), each on `host` with
 * port 0, or the port `ports` gives for its key.
 */
export function separateListenLines(host: string, o: { optional?: boolean; ports?: Readonly<Record<string, number>> } = {}): string[] {
  return separateListenKeys(o).map((key) => `  ${key}: ${host}:${o.ports?.[key] ?? 0}`);
}
