/**
 * gwsh's grant session (src/client/e2e.ts GrantSession) against a TLS server written from the contract
 * (test/helpers/e2eclient.ts): answers matched by id in any order, a Proxy of an earlier version remembered, a
 * closed session opened again, hostile answers (oversized, not JSON, lying, never) each ending in the classic
 * route's reason within the request's deadline, the in-flight cap; and --e2e / GWSH_E2E.
 */
import net from 'node:net';
import tls from 'node:tls';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { e2eModeOf, GRANT_QUEUE_MAX, GrantSession, serviceOfTarget, type GrantOutcome } from '../../src/client/e2e.js';
import { Dialer } from '../../src/dial/dialer.js';
import { GatewayError } from '../../src/errors.js';
import { writeJsonLine } from '../../src/stream/lines.js';
import { GRANT_SESSION_INFLIGHT_MAX, type GrantRequest } from '../../src/tunnel/e2e.js';
import { failureOf } from '../helpers/errors.js';
import { grantAnswerFor, makeE2EPki, profileFor, startFakeProxy, type E2EPki, type FakeProxy, type FakeProxyOptions } from '../helpers/e2eclient.js';

let pki: E2EPki;
beforeAll(async () => {
  pki = await makeE2EPki();
});

const proxies: FakeProxy[] = [];
const sessions: GrantSession[] = [];
afterEach(async () => {
  for (const s of sessions.splice(0)) s.close();
  for (const p of proxies.splice(0)) await p.close();
});

async function setup(options: FakeProxyOptions = {}, timeoutMs = 5_000): Promise<{ proxy: FakeProxy; session: GrantSession }> {
  const proxy = await startFakeProxy(pki, options);
  proxies.push(proxy);
  const session = new GrantSession({ profile: profileFor(pki, proxy.address), dialer: new Dialer({ env: {} }), address: proxy.address, timeoutMs });
  sessions.push(session);
  return { proxy, session };
}

const ask = (session: GrantSession, resource = 'echo') => session.request({ resource, route: 'gateway-tcp', kind: 'app' });

function agentOf(o: GrantOutcome): string {
  if (o.kind !== 'grant') throw new Error(`expected a grant, got classic: ${o.reason}`);
  return o.grant.agent;
}

describe('grant session', () => {
  it('sends the route as the classic route names it and keeps one session for many requests', async () => {
    const { proxy, session } = await setup();
    expect(agentOf(await ask(session))).toBe('agent-1');
    expect(agentOf(await session.request({ resource: 'node1', route: 'gateway-proxy-ssh', login: 'root' }))).toBe('agent-1');
    expect(proxy.counts.grant).toBe(1);
    expect(proxy.requests[0]).toMatchObject({ resource: 'echo', route: 'gateway-tcp', kind: 'app' });
    expect(proxy.requests[1]).toMatchObject({ resource: 'node1', route: 'gateway-proxy-ssh', login: 'root' });
    expect(proxy.requests[0]!.id).not.toBe(proxy.requests[1]!.id);
  });

  it('matches answers by id when the Proxy answers out of order', async () => {
    const held: GrantRequest[] = [];
    const { session } = await setup({
      onGrant: (req, socket) => {
        held.push(req);
        if (held.length < 2) return;
        // The second first, each naming the agent of its resource.
        for (const r of [...held].reverse()) writeJsonLine(socket, grantAnswerFor(pki, r.id, `agent-of-${r.resource}`));
      },
    });
    const [a, b] = await Promise.all([ask(session, 'one'), ask(session, 'two')]);
    expect(agentOf(a)).toBe('agent-of-one');
    expect(agentOf(b)).toBe('agent-of-two');
  });

  it('a Proxy that answers no_application_protocol is remembered as an earlier version: never asked again', async () => {
    const { proxy, session } = await setup({ alpn: ['gateway-tcp'] });
    const first = await ask(session);
    expect(first).toMatchObject({ kind: 'classic' });
    expect(first.kind === 'classic' && first.reason).toMatch(/does not take grant requests.*earlier version/);
    expect(session.noE2E).toBeDefined();
    expect(await ask(session)).toMatchObject({ kind: 'classic' });
    // One handshake attempt in all (refused), no grant session.
    expect(proxy.counts.grant).toBe(0);
  });

  it('a Proxy that completes TLS without choosing the grant ALPN is remembered too', async () => {
    // A TLS server that knows no ALPN at all (an old web port) in front of the same certificate.
    const plain = tls.createServer({ cert: pki.proxy.certPem, key: pki.proxy.keyPem }, (s) => s.on('error', () => undefined));
    let handshakes = 0;
    plain.on('connection', () => handshakes++);
    await new Promise<void>((resolve) => plain.listen(0, '127.0.0.1', resolve));
    const address = `127.0.0.1:${(plain.address() as { port: number }).port}`;
    const session = new GrantSession({ profile: profileFor(pki, address), dialer: new Dialer({ env: {} }), address, timeoutMs: 5000 });
    sessions.push(session);
    try {
      const o = await ask(session);
      expect(o.kind === 'classic' && o.reason).toMatch(/chose ALPN none/);
      await ask(session);
      expect(handshakes).toBe(1);
    } finally {
      plain.close();
    }
  });

  it('a session the Proxy closed is opened again on the next request', async () => {
    const { proxy, session } = await setup({
      onGrant: (req, socket) => {
        writeJsonLine(socket, grantAnswerFor(pki, req.id, 'agent-1'));
        socket.end();
      },
    });
    expect(agentOf(await ask(session))).toBe('agent-1');
    expect(agentOf(await ask(session))).toBe('agent-1');
    expect(proxy.counts.grant).toBe(2);
  });

  it('a request crossed by the Proxy closing a reused session is sent once more on a new one', async () => {
    let n = 0;
    const { proxy, session } = await setup({
      onGrant: (req, socket) => {
        n++;
        // The first request is answered; the second is dropped with its session (an idle close crossing it).
        if (n === 2) return void socket.destroy();
        writeJsonLine(socket, grantAnswerFor(pki, req.id, 'agent-1'));
      },
    });
    expect(agentOf(await ask(session))).toBe('agent-1');
    expect(agentOf(await ask(session))).toBe('agent-1');
    expect(proxy.counts.grant).toBe(2);
    expect(proxy.requests).toHaveLength(3);
  });

  it('a Proxy that ends every session unanswered (no grant service behind the route): one session per request, no retry', async () => {
    const { proxy, session } = await setup({ onGrant: (_req, socket) => socket.end() });
    for (let i = 0; i < 3; i++) {
      const o = await ask(session);
      expect(o.kind === 'classic' && o.reason).toMatch(/closed the grant session/);
    }
    expect(proxy.counts.grant).toBe(3);
  });

  it('an answer line over 16 KiB ends the session: this request goes classic, the next opens a new session', async () => {
    let n = 0;
    const { proxy, session } = await setup({
      onGrant: (req, socket) => {
        if (n++ === 0) socket.write(`{"id":${req.id},"pad":"${'x'.repeat(20_000)}"}\n`);
        else writeJsonLine(socket, grantAnswerFor(pki, req.id, 'agent-1'));
      },
    });
    const o = await ask(session);
    expect(o.kind === 'classic' && o.reason).toMatch(/longer than 16384 bytes/);
    expect(session.noE2E).toBeUndefined();
    expect(agentOf(await ask(session))).toBe('agent-1');
    expect(proxy.counts.grant).toBe(2);
  });

  it.each([
    ['not JSON', 'hello\n', /not JSON/],
    ['not an object', '[1,2]\n', /not an object/],
    ['a grant without a server name of a grant', JSON.stringify({ id: 1, ok: true, grant: 'a.b', agent: 'x', server_name: 'proxy.example.com', expires: 1 }) + '\n', /server_name/],
    ['an answer neither ok nor refused', JSON.stringify({ id: 1, ok: 'yes' }) + '\n', /ok is not a boolean/],
  ])('a hostile answer (%s) goes classic with the reason', async (_what, line, reason) => {
    const { session } = await setup({ onGrant: (_req, socket) => socket.write(line) });
    const o = await ask(session);
    expect(o.kind === 'classic' && o.reason).toMatch(reason);
  });

  it('a grant whose token names another agent than the answer is not used', async () => {
    const { session } = await setup({ onGrant: (req, socket) => writeJsonLine(socket, { ...grantAnswerFor(pki, req.id, 'agent-1'), agent: 'agent-2' }) });
    const o = await ask(session);
    expect(o.kind === 'classic' && o.reason).toMatch(/another agent/);
  });

  it('answers to ids never asked are ignored; the real one still counts', async () => {
    const { session } = await setup({
      onGrant: (req, socket) => {
        writeJsonLine(socket, grantAnswerFor(pki, req.id + 1000, 'agent-lie'));
        writeJsonLine(socket, grantAnswerFor(pki, req.id, 'agent-1'));
      },
    });
    expect(agentOf(await ask(session))).toBe('agent-1');
  });

  it('a Proxy that never answers: the request ends at its deadline with the reason, and the session is dropped', async () => {
    const { proxy, session } = await setup({ onGrant: () => undefined }, 300);
    const o = await ask(session);
    expect(o.kind === 'classic' && o.reason).toMatch(/did not answer the grant request within 300 ms/);
    await ask(session);
    expect(proxy.counts.grant).toBe(2);
  });

  it("`classic` is the Proxy's reason, printed without control characters", async () => {
    const { session } = await setup({ onGrant: (req, socket) => writeJsonLine(socket, { id: req.id, ok: false, classic: true, reason: 'agent of an earlier version\u001b[2J' }) });
    const o = await ask(session);
    expect(o).toEqual({ kind: 'classic', reason: 'the Proxy answered: agent of an earlier version?[2J' });
  });

  it('a refusal is an error with its code, never the classic route', async () => {
    const { session } = await setup({
      onGrant: (req, socket) => writeJsonLine(socket, { id: req.id, ok: false, error: { code: 'GW_ERR_ACCESS_DENIED', message: 'your roles do not allow app echo', hint: 'ask' } }),
    });
    const err = await failureOf(ask(session));
    expect(err.code).toBe('GW_ERR_ACCESS_DENIED');
    expect(err.message).toMatch(/do not allow/);
    // A code this version does not know is still an error.
    const { session: s2 } = await setup({ onGrant: (req, socket) => writeJsonLine(socket, { id: req.id, ok: false, error: { code: 'GW_ERR_FROM_THE_FUTURE', message: 'no' } }) });
    expect((await failureOf(ask(s2))).code).toBe('GW_ERR_TUNNEL_DIAL_FAILED');
  });

  it(`keeps at most ${GRANT_SESSION_INFLIGHT_MAX} requests in flight; the rest wait their turn`, async () => {
    let outstanding = 0;
    let most = 0;
    const held: Array<{ req: GrantRequest; socket: tls.TLSSocket }> = [];
    const release = () => {
      for (const h of held.splice(0)) {
        outstanding--;
        writeJsonLine(h.socket, grantAnswerFor(pki, h.req.id, 'agent-1'));
      }
    };
    const { session } = await setup({
      onGrant: (req, socket) => {
        outstanding++;
        most = Math.max(most, outstanding);
        held.push({ req, socket });
        // Answer in batches once the cap is reached (or what is left of the 20).
        if (held.length === GRANT_SESSION_INFLIGHT_MAX || outstanding + answered === 20) release();
      },
    });
    let answered = 0;
    const all = await Promise.all(
      Array.from({ length: 20 }, () =>
        ask(session).then((o) => {
          answered++;
          return o;
        }),
      ),
    );
    expect(all.every((o) => o.kind === 'grant')).toBe(true);
    expect(most).toBe(GRANT_SESSION_INFLIGHT_MAX);
  });

  it(`a Proxy that holds every request: at most ${GRANT_SESSION_INFLIGHT_MAX} sent, ${GRANT_QUEUE_MAX} waiting, the next goes classic at once`, async () => {
    const { proxy, session } = await setup({ onGrant: () => undefined }, 2_000);
    const all = Array.from({ length: GRANT_SESSION_INFLIGHT_MAX + GRANT_QUEUE_MAX }, () => ask(session));
    const extra = await ask(session);
    expect(extra.kind === 'classic' && extra.reason).toMatch(/more than 256 grant requests are waiting/);
    const settled = await Promise.all(all);
    expect(settled.every((o) => o.kind === 'classic')).toBe(true);
    // Only the first 16 reached the Proxy: the rest waited for a slot until their deadline.
    expect(proxy.requests.length).toBeLessThanOrEqual(GRANT_SESSION_INFLIGHT_MAX * 2);
  });

  it('a Proxy that takes the TCP connection and never starts TLS: the request ends at its deadline', async () => {
    const silent = net.createServer(() => undefined);
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const held: net.Socket[] = [];
    silent.on('connection', (s) => held.push(s));
    const address = `127.0.0.1:${(silent.address() as net.AddressInfo).port}`;
    const session = new GrantSession({ profile: profileFor(pki, address), dialer: new Dialer({ env: {} }), address, timeoutMs: 300 });
    sessions.push(session);
    try {
      const o = await ask(session);
      expect(o.kind === 'classic' && o.reason).toMatch(/within 300 ms/);
      expect(session.noE2E).toBeUndefined();
    } finally {
      for (const s of held) s.destroy();
      silent.close();
    }
  });

  it('after close() no session is opened', async () => {
    const { proxy, session } = await setup();
    session.close();
    expect(await ask(session)).toMatchObject({ kind: 'classic' });
    expect(proxy.counts.grant).toBe(0);
  });
});

describe('--e2e and GWSH_E2E', () => {
  it('the flag wins over the environment; auto by default', () => {
    expect(e2eModeOf(undefined, {})).toBe('auto');
    expect(e2eModeOf(undefined, { GWSH_E2E: '' })).toBe('auto');
    expect(e2eModeOf(undefined, { GWSH_E2E: 'require' })).toBe('require');
    expect(e2eModeOf('off', { GWSH_E2E: 'require' })).toBe('off');
    expect(e2eModeOf('auto', { GWSH_E2E: 'off' })).toBe('auto');
  });

  it.each([
    ['--e2e', 'yes', {}],
    ['GWSH_E2E', undefined, { GWSH_E2E: 'always' }],
    ['--e2e', 'AUTO', {}],
  ])('a bad value of %s is GW_ERR_USAGE naming the values', (source, flag, env) => {
    let err: unknown;
    try {
      e2eModeOf(flag, env);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(GatewayError);
    expect((err as GatewayError).code).toBe('GW_ERR_USAGE');
    expect((err as GatewayError).message).toContain(source);
    expect((err as GatewayError).hint).toMatch(/auto.*require.*off/);
  });

  it('each route maps to the service whose system role the agent must hold', () => {
    expect(serviceOfTarget({ alpn: 'gateway-proxy-ssh' })).toBe('ssh');
    expect(serviceOfTarget({ alpn: 'gateway-tcp', kind: 'app' })).toBe('app');
    expect(serviceOfTarget({ alpn: 'gateway-postgres' })).toBe('db');
    expect(serviceOfTarget({ alpn: 'gateway-redis' })).toBe('db');
    // A database protocol of a newer Proxy: no end-to-end stream from this version (the classic route serves it).
    expect(serviceOfTarget({ alpn: 'gateway-cassandra' })).toBeUndefined();
  });
});
