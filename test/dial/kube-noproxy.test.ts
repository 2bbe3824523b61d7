/**
 * The Kubernetes Service's dial of its API server with a real squid as HTTPS_PROXY (docs/dialing.md, rule 5): when
 * NO_PROXY exempts the API server's real address (a CIDR entry), or kube.<cluster>.local, the agent connects
 * directly and squid sees no CONNECT; without either it goes through squid.
 *
 * The API server stands in as an HTTPS server on this side of a veth pair (198.18.0.0/15, not loopback, so rule 1
 * does not make every dial direct anyway). Whether squid was used is read from its access log: the one dial made
 * through it is logged, and it must be the only CONNECT to that address.
 */
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { rootSuite } from '../helpers/root.js';
import { resourceConnector } from '../../src/agent/resources.js';
import { parseConfig, type GatewayConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { createTestHost, type TestHost } from '../helpers/netns.js';
import { startHttpsServer, type HttpTestServer } from '../helpers/servers.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';

const CLUSTER = 'kube.example';

let host: TestHost;
let pki: TestPki;
let api: HttpTestServer;
let squid: Squid;
let config: GatewayConfig;
let apiAddr: string;

/** One request over the connection the agent opened; resolves with the answer's body. */
function get(socket: Duplex): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = '';
    socket.on('data', (c: Buffer) => (text += c.toString()));
    socket.once('end', () => resolve(text.slice(text.indexOf('\r\n\r\n') + 4)));
    socket.once('error', reject);
    socket.write('GET /version HTTP/1.1\r\nHost: k8s\r\nConnection: close\r\n\r\n');
  });
}

async function dialApi(env: Record<string, string>): Promise<string> {
  const connect = resourceConnector(config, ['kube_service'], new Dialer({ env: { HTTPS_PROXY: squid.url, ...env } }), CLUSTER, 5_000);
  const socket = await connect({ service: 'kube', resource: 'dev', client_src: '192.0.2.1:1', client_dst: '192.0.2.2:443' });
  return get(socket);
}

beforeAll(async () => {
  host = await createTestHost();
  pki = await makeTestPki();
  const cert = await pki.serverCert({ names: ['k8s.internal'], ips: [host.localIp] });
  api = await startHttpsServer({ cert: cert.certPem, key: cert.keyPem }, (_req, res) => res.end('{"gitVersion":"v1.30.0"}'), host.localIp);
  apiAddr = `${host.localIp}:${api.port}`;
  const caFile = join(pki.dir, 'kube-ca.pem');
  await writeFile(caFile, pki.caPem);
  config = parseConfig(['kube_service:', '  enabled: yes', '  clusters:', `    - { name: dev, api_server: "https://${apiAddr}", ca_file: ${caFile} }`, ''].join('\n'), 'test.yaml');
  squid = await startSquid();
}, 60_000);

afterAll(async () => {
  await squid?.stop();
  await api?.close();
  await pki?.cleanup();
  await host?.close();
});

// The API server's real address must not be loopback (NO_PROXY's CIDR entry is what is tested): a test host.
rootSuite(['netns'])("the Kubernetes Service's dial of its API server under HTTPS_PROXY", () => {
  it('NO_PROXY exempting the real address (CIDR) or kube.<cluster>.local: direct, squid logs no CONNECT; neither: through squid', async () => {
    expect(await dialApi({ NO_PROXY: '198.18.0.0/15' })).toContain('v1.30.0');
    expect(await dialApi({ NO_PROXY: `${host.localIp}:${api.port}` })).toContain('v1.30.0');
    expect(await dialApi({ NO_PROXY: `kube.${CLUSTER}.local` })).toContain('v1.30.0');
    // The control: nothing exempts it, so it goes through squid, which logs it when the tunnel closes.
    expect(await dialApi({ NO_PROXY: 'example.org' })).toContain('v1.30.0');
    await squid.waitForAccessLog((l) => l.includes(`CONNECT ${apiAddr} 200`));
    const connects = (await squid.readAccessLog()).filter((l) => l.includes(`CONNECT ${apiAddr}`));
    expect(connects).toHaveLength(1);
  });
});
