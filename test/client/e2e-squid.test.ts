/**
 * gwsh's end-to-end streams under HTTPS_PROXY: the grant session and the end-to-end connection are both dialled
 * through the Dialer, so through a real squid (CONNECT), as the classic routes are; the Proxy's name resolves
 * only in squid's hosts file, so a dial that skipped the proxy would fail.
 */
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { E2EStreams } from '../../src/client/e2e.js';
import { Dialer } from '../../src/dial/dialer.js';
import { makeE2EPki, profileFor, PROXY_NAME, startFakeProxy, type E2EPki, type FakeProxy } from '../helpers/e2eclient.js';
import { startSquid, type Squid } from '../helpers/squid.js';

let pki: E2EPki;
let proxy: FakeProxy;
let squid: Squid;
let shared: string;

beforeAll(async () => {
  pki = await makeE2EPki();
  const agent = await pki.host.issue({ name: 'agent-1', roles: ['app'] });
  proxy = await startFakeProxy(pki, { agentCert: () => agent });
  // Squid, which runs as the user proxy, reads its hosts file from a directory anyone may enter.
  shared = await mkdtemp(join(tmpdir(), 'gw-e2e-squid-'));
  await chmod(shared, 0o755);
  await writeFile(join(shared, 'hosts'), `127.0.0.1 ${PROXY_NAME}\n`, { mode: 0o644 });
  squid = await startSquid({ extraConfig: [`hosts_file ${join(shared, 'hosts')}`] });
}, 60_000);

afterAll(async () => {
  await squid?.stop();
  await proxy?.close();
  if (shared) await rm(shared, { recursive: true, force: true });
});

describe('end-to-end streams through HTTPS_PROXY', () => {
  it('the grant session and the stream each go through a CONNECT of squid', async () => {
    const address = `${PROXY_NAME}:${proxy.address.split(':')[1]}`;
    const dialer = new Dialer({ env: { HTTPS_PROXY: squid.url } });
    const streams = new E2EStreams({ profile: profileFor(pki, address), dialer, mode: 'require', classicAddress: address, e2eAddress: address });
    const opened = await streams.open({ alpn: 'gateway-tcp', resource: 'echo', kind: 'app' });
    expect(opened).toMatchObject({ e2e: true, agent: 'agent-1' });
    opened.stream.write('through squid');
    const [chunk] = (await new Promise<Buffer[]>((resolve) => opened.stream.once('data', (c: Buffer) => resolve([c])))) as [Buffer];
    expect(chunk.toString()).toBe('through squid');
    opened.stream.destroy();
    streams.close();
    // Squid logs a CONNECT when its tunnel closes: one for the grant session, one for the stream.
    await squid.waitForAccessLog((l) => l.includes(`CONNECT ${address}`));
    const connects = async () => (await squid.readAccessLog()).filter((l) => l.includes(`CONNECT ${address}`)).length;
    await expect.poll(connects, { timeout: 10_000 }).toBe(2);
    expect(proxy.counts).toMatchObject({ grant: 1, e2e: 1, classic: 0 });
  });
});
