/**
 * What the proxy labs' Dialer tests share (test/dial/lab-kerberos.test.ts, lab-ntlm.test.ts): the proxy's names
 * resolved for the Dialer (the labs' squids listen on 127.0.0.2 under names no resolver knows, as the Kerberos
 * service principal needs a name), a target name only squid resolves (a loopback target would be dialled
 * directly: select.ts rule 1), and a plain HTTP GET through the tunnel a dial returned.
 */
import dns from 'node:dns';
import { chmod, mkdtemp, writeFile } from 'node:fs/promises';
import type net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** The web server's name behind the proxy: squid resolves it to WEB_IP through webHostsFile(). */
export const WEB_NAME = 'web.gw.test';
export const WEB_IP = '127.0.0.3';
const PROXY_IP = '127.0.0.2';

/** Any *.gw.test name but the web server's is a name of the lab's squid (proxy.gw.test, elsewhere.gw.test, ...). */
export const labLookup: net.LookupFunction = (hostname, options, callback) => {
  if (!hostname.endsWith('.gw.test') || hostname === WEB_NAME) return dns.lookup(hostname, options, callback as never);
  if ((options as dns.LookupAllOptions).all) (callback as never as (e: null, a: dns.LookupAddress[]) => void)(null, [{ address: PROXY_IP, family: 4 }]);
  else (callback as never as (e: null, a: string, f: number) => void)(null, PROXY_IP, 4);
};

/** A hosts file for squid's `hosts_file` that names the web server. */
export async function webHostsFile(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'gw-labhosts-'));
  await chmod(dir, 0o755); // squid reads it as its own user
  const file = join(dir, 'hosts');
  await writeFile(file, `${WEB_IP} ${WEB_NAME}\n`, { mode: 0o644 });
  return file;
}

/** Sends an HTTP GET through the tunnel and resolves with the whole answer (the server closes after it). */
export function getThroughTunnel(tunnel: net.Socket, hostPort: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let out = '';
    tunnel.on('data', (d: Buffer) => (out += d.toString()));
    tunnel.once('end', () => resolve(out));
    tunnel.once('error', reject);
    tunnel.write(`GET / HTTP/1.1\r\nHost: ${hostPort}\r\nConnection: close\r\n\r\n`);
  });
}
