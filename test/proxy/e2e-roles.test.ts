/**
 * End-to-end streams through the Proxy role as the daemon composes it (src/roles/proxy.ts e2eServices): two
 * Proxies of one cluster (test/proxy/peering-harness.ts), an agent whose only tunnel goes to Proxy B.
 *
 *   peering   a grant asked of A for the agent's app: `classic` (this version carries end-to-end streams only
 *             through the Proxy that holds the tunnel), never a grant A cannot route
 *   wiring    B answers a grant request (a grant signed with the key of the certificate its tunnels see, naming
 *             B, or `classic` when the agent's hello offers no e2e); the one port passes a stream whose line
 *             carries no grant to the relay (alert access_denied, not a close for an unknown protocol) and
 *             closes a data connection whose key is no tunnel's
 */
import { X509Certificate } from 'node:crypto';
import { once } from 'node:events';
import net from 'node:net';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger, setRootLogger } from '../../src/log.js';
import { readLine } from '../../src/stream/lines.js';
import { dataPreamble, E2E_ALPN, e2eLine, e2eServerName, GRANT_ALPN, verifyGrant, type GrantAnswer } from '../../src/tunnel/e2e.js';
import { waitUntil } from '../helpers/wait.js';
import { splitAddr, startPeerCluster, type PeerCluster } from './peering-harness.js';

setRootLogger(createLogger({ level: 'silent' }));

let c: PeerCluster;

beforeAll(async () => {
  c = await startPeerCluster();
  await waitUntil('A sees the agent at B', () => c.a.cluster.locations(c.agentIdentity.hostId).includes(c.b.id));
}, 60_000);

afterAll(async () => {
  await c?.stop();
});

/** One grant request for the TCP app on the Proxy at `web`, and the Proxy's certificate. */
async function ask(web: string, resource = 'echo'): Promise<{ answer: GrantAnswer; proxyCert: X509Certificate }> {
  const { host, port } = splitAddr(web);
  const socket = tls.connect({ host, port, servername: 'localhost', ca: c.auth.auth.host.tls.certPem, key: c.user.key, cert: c.user.cert, ALPNProtocols: [GRANT_ALPN] });
  socket.on('error', () => undefined);
  await once(socket, 'secureConnect');
  const proxyCert = socket.getPeerX509Certificate()!;
  socket.write(`${JSON.stringify({ id: 1, resource, route: 'gateway-tcp', kind: 'app' })}\n`);
  const answer = JSON.parse(await readLine(socket, { what: 'grant answer', timeoutMs: 10_000 })) as GrantAnswer;
  socket.destroy();
  return { answer, proxyCert };
}

describe('end-to-end streams in the Proxy role', () => {
  it('a Proxy that reaches the agent only over peering answers classic, with the reason', async () => {
    const { answer } = await ask(c.a.addresses.web!);
    expect(answer).toMatchObject({ id: 1, ok: false, classic: true });
    expect(answer.ok === false && 'classic' in answer && answer.reason).toMatch(/no tunnel to this Proxy/);
  });

  it('the Proxy holding the tunnel answers: a grant signed with its tunnel certificate’s key, or classic for an agent without the capability', async () => {
    const { answer, proxyCert } = await ask(c.b.addresses.web!);
    if (answer.ok) {
      const checked = verifyGrant(answer.grant, proxyCert, Date.now());
      expect(checked.ok && checked.grant.iss).toBe(c.b.id);
    } else {
      expect(answer).toMatchObject({ classic: true });
      expect('classic' in answer && answer.reason).toMatch(/does not offer end-to-end streams/);
    }
    const refused = await ask(c.b.addresses.web!, 'no-such-app');
    expect(refused).toMatchObject({ answer: { ok: false, error: { code: 'GW_ERR_TUNNEL_NOT_FOUND' } } });
  });

  it('the one port routes an end-to-end stream to the relay (no grant: access_denied) and a data connection to the registry', async () => {
    const { host, port } = splitAddr(c.b.addresses.web!);
    const raw = net.connect(port, host);
    raw.on('error', () => undefined);
    await once(raw, 'connect');
    raw.write(e2eLine('aaaa.bbbb'));
    const e2e = tls.connect({ socket: raw, servername: e2eServerName('0'.repeat(32)), ca: c.auth.auth.host.tls.certPem, ALPNProtocols: [E2E_ALPN] });
    const err = await new Promise<Error>((resolve) => e2e.once('error', resolve));
    expect(err.message).toMatch(/access denied/i);
    const data = net.connect(port, host);
    data.on('error', () => undefined);
    await once(data, 'connect');
    data.write(dataPreamble([Buffer.alloc(32, 7)], 1));
    let answer = '';
    data.on('data', (chunk: Buffer) => (answer += chunk.toString('latin1')));
    await once(data, 'close');
    expect(answer).toBe('GWDATA1 no unknown-tunnel\n');
    expect(c.b.tunnels.data.idleCount()).toBe(0);
  });
});
