/**
 * gwsh's end-to-end connection (src/client/e2e.ts connectE2E) and the choice per connection (E2EStreams), against
 * real TLS servers holding certificates of the test PKI (test/helpers/e2eclient.ts): the grant's agent passes;
 * another host ID, a host without the service's role, another cluster's CA, a user certificate presented as a
 * server are GW_ERR_E2E_AGENT with no fallback; a failure before any certificate falls back under auto and is
 * GW_ERR_E2E_UNAVAILABLE under require; the agent's refusal is printed with its code.
 */
import { once } from 'node:events';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { E2EStreams, connectE2E, type E2EMode, type GrantOk } from '../../src/client/e2e.js';
import { resourceTlsContext } from '../../src/client/resources.js';
import { Dialer } from '../../src/dial/dialer.js';
import { FramedStream } from '../../src/stream/framed.js';
import { writeJsonLine } from '../../src/stream/lines.js';
import { failureOf } from '../helpers/errors.js';
import { grantAnswerFor, makeE2EPki, profileFor, startFakeProxy, type E2EPki, type FakeProxy, type FakeProxyOptions } from '../helpers/e2eclient.js';
import type { IssuedCert } from '../helpers/members.js';

let pki: E2EPki;
let agent1: IssuedCert;
beforeAll(async () => {
  pki = await makeE2EPki();
  agent1 = await pki.host.issue({ name: 'agent-1', roles: ['node', 'app'] });
});

const proxies: FakeProxy[] = [];
const closers: Array<() => void> = [];
afterEach(async () => {
  for (const c of closers.splice(0)) c();
  for (const p of proxies.splice(0)) await p.close();
});

async function proxyWith(options: FakeProxyOptions): Promise<FakeProxy> {
  const p = await startFakeProxy(pki, options);
  proxies.push(p);
  return p;
}

function grantOf(agent = 'agent-1'): GrantOk {
  const a = grantAnswerFor(pki, 1, agent);
  return { grant: a.grant as string, agent, server_name: a.server_name as string, expires: a.expires as number };
}

async function roundTrip(stream: Duplex, text: string): Promise<string> {
  stream.write(text);
  const [chunk] = (await once(stream, 'data')) as [Buffer];
  return chunk.toString();
}

const dialer = () => new Dialer({ env: {} });

describe('connectE2E', () => {
  it("the grant line, then the grant's agent with the service's role: the DialAnswer, then the stream", async () => {
    const p = await proxyWith({ agentCert: () => agent1 });
    const grant = grantOf();
    const r = await connectE2E(profileFor(pki, p.address), dialer(), p.address, grant, 'app');
    if (!r.ok) throw new Error(r.reason);
    closers.push(() => r.stream.destroy());
    expect(await roundTrip(r.stream, 'ping')).toBe('ping');
    // Ahead of its TLS the stream said which grant it carries: any Proxy of the cluster routes it by that line.
    expect(p.lines).toEqual([grant.grant]);
  });

  const hostile: Array<[string, () => Promise<IssuedCert>, RegExp]> = [
    ['another host ID', () => pki.host.issue({ name: 'agent-2', roles: ['node', 'app'] }), /host certificate of "agent-2"/],
    ["a host without the service's role", () => pki.host.issue({ name: 'agent-1', roles: ['db'] }), /roles db/],
    ['a Proxy of the cluster', () => pki.host.issue({ name: 'agent-1', roles: ['proxy'] }), /roles proxy/],
    ["another cluster's host CA", () => pki.other.issue({ name: 'agent-1', roles: ['app'] }), /did not pass the check against the cluster's host CA/],
    ['a user certificate of the host CA', () => pki.host.issue({ name: 'agent-1', roles: ['app'], kind: 'user' }), /a user certificate/],
    ['a user certificate of the user CA', async () => pki.user, /did not pass the check against the cluster's host CA/],
  ];
  it.each(hostile)('%s is GW_ERR_E2E_AGENT; nothing is sent', async (_what, make, message) => {
    const cert = await make();
    let received = 0;
    const p = await proxyWith({ agentCert: () => cert, onE2E: (s) => s.on('data', (c: Buffer) => (received += c.length)) });
    const err = await failureOf(connectE2E(profileFor(pki, p.address), dialer(), p.address, grantOf(), 'app', { answerTimeoutMs: 5000 }));
    expect(err.code).toBe('GW_ERR_E2E_AGENT');
    expect(err.message).toMatch(message);
    expect(received).toBe(0);
  });

  it('a failure before any certificate (the handshake refused) is a reason to fall back, not an error', async () => {
    const p = await proxyWith({ agentCert: () => undefined });
    const r = await connectE2E(profileFor(pki, p.address), dialer(), p.address, grantOf(), 'app');
    expect(r.ok).toBe(false);
    expect(!r.ok && r.reason).toMatch(/failed before the agent answered/);
  });

  it('a connection closed at once (no TLS at all) is a reason to fall back', async () => {
    const server = net.createServer((s) => s.destroy());
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    closers.push(() => server.close());
    const address = `127.0.0.1:${(server.address() as net.AddressInfo).port}`;
    const r = await connectE2E(profileFor(pki, address), dialer(), address, grantOf(), 'app');
    expect(r.ok).toBe(false);
  });

  it('a peer that takes the TCP connection and never answers the ClientHello: a reason to fall back, at the deadline', async () => {
    const held: net.Socket[] = [];
    const server = net.createServer((s) => held.push(s));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    closers.push(() => {
      for (const s of held) s.destroy();
      server.close();
    });
    const address = `127.0.0.1:${(server.address() as net.AddressInfo).port}`;
    const r = await connectE2E(profileFor(pki, address), dialer(), address, grantOf(), 'app', { handshakeTimeoutMs: 300 });
    expect(r.ok).toBe(false);
    expect(!r.ok && r.reason).toMatch(/did not complete within 300 ms/);
  });

  it("the agent's refusal in its DialAnswer is an error with the agent's code", async () => {
    const p = await proxyWith({
      agentCert: () => agent1,
      onE2E: (s) => {
        writeJsonLine(s, { ok: false, error: { code: 'GW_ERR_DB_USER_DENIED', message: 'database user "root" is not allowed' } });
        s.end();
      },
    });
    const err = await failureOf(connectE2E(profileFor(pki, p.address), dialer(), p.address, grantOf(), 'app'));
    expect(err.code).toBe('GW_ERR_DB_USER_DENIED');
    expect(err.message).toMatch(/agent-1 refused the end-to-end stream: database user "root"/);
  });

  it('an agent that never answers: its deadline; an oversized answer: refused', async () => {
    const silent = await proxyWith({ agentCert: () => agent1, onE2E: () => undefined });
    const err = await failureOf(connectE2E(profileFor(pki, silent.address), dialer(), silent.address, grantOf(), 'app', { answerTimeoutMs: 200 }));
    expect(err.code).toBe('GW_ERR_TUNNEL_TIMEOUT');
    const big = await proxyWith({ agentCert: () => agent1, onE2E: (s) => s.write('x'.repeat(10_000)) });
    expect((await failureOf(connectE2E(profileFor(pki, big.address), dialer(), big.address, grantOf(), 'app'))).code).toBe('GW_ERR_TUNNEL_PROTOCOL');
  });
});

describe('E2EStreams: end-to-end or classic per connection', () => {
  async function open(mode: E2EMode, options: FakeProxyOptions) {
    const p = await proxyWith(options);
    const lines: string[] = [];
    const streams = new E2EStreams({ profile: profileFor(pki, p.address), dialer: dialer(), mode, classicAddress: p.address, e2eAddress: p.address, debug: (l) => lines.push(l), grantTimeoutMs: 5000 });
    closers.push(() => streams.close());
    return { p, lines, open: () => streams.open({ alpn: 'gateway-tcp', resource: 'echo', kind: 'app' }) };
  }

  it('auto: a grant and the agent → end-to-end, said with the agent', async () => {
    const t = await open('auto', { agentCert: () => agent1 });
    const o = await t.open();
    closers.push(() => o.stream.destroy());
    expect(o).toMatchObject({ e2e: true, agent: 'agent-1' });
    expect(await roundTrip(o.stream, 'ping')).toBe('ping');
    expect(t.p.counts).toEqual({ grant: 1, e2e: 1, classic: 0 });
    expect(t.lines).toEqual(['echo: end-to-end to agent agent-1']);
  });

  it('auto: `classic` from the Proxy → the classic route, with the reason at debug', async () => {
    const t = await open('auto', { onGrant: (req, s) => writeJsonLine(s, { id: req.id, ok: false, classic: true, reason: 'the agent is of an earlier version' }) });
    const o = await t.open();
    closers.push(() => o.stream.destroy());
    expect(o).toMatchObject({ e2e: false, reason: 'the Proxy answered: the agent is of an earlier version' });
    expect(await roundTrip(o.stream, 'x')).toMatch(/^classic:/);
    expect(t.lines[0]).toMatch(/classic route.*earlier version/);
  });

  it('require: `classic` from the Proxy → GW_ERR_E2E_UNAVAILABLE naming the reason; no classic route', async () => {
    const t = await open('require', { onGrant: (req, s) => writeJsonLine(s, { id: req.id, ok: false, classic: true, reason: 'its tunnel is on another Proxy' }) });
    const err = await failureOf(t.open());
    expect(err.code).toBe('GW_ERR_E2E_UNAVAILABLE');
    expect(err.message).toMatch(/another Proxy/);
    expect(t.p.counts.classic).toBe(0);
  });

  it('auto and require: a Proxy of an earlier version (no grant ALPN)', async () => {
    const auto = await open('auto', { alpn: ['gateway-tcp'] });
    const o = await auto.open();
    closers.push(() => o.stream.destroy());
    expect(o.e2e).toBe(false);
    const req = await open('require', { alpn: ['gateway-tcp'] });
    expect((await failureOf(req.open())).code).toBe('GW_ERR_E2E_UNAVAILABLE');
  });

  it('auto: a failure before the agent certificate → classic; require → GW_ERR_E2E_UNAVAILABLE', async () => {
    const auto = await open('auto', { agentCert: () => undefined });
    const o = await auto.open();
    closers.push(() => o.stream.destroy());
    expect(o.e2e).toBe(false);
    expect(auto.p.counts.classic).toBe(1);
    const req = await open('require', { agentCert: () => undefined });
    const err = await failureOf(req.open());
    expect(err.code).toBe('GW_ERR_E2E_UNAVAILABLE');
    expect(err.message).toMatch(/before the agent answered/);
  });

  it('auto: a certificate that is not the agent\'s → GW_ERR_E2E_AGENT, and NO classic route', async () => {
    const other = await pki.host.issue({ name: 'agent-2', roles: ['app'] });
    const t = await open('auto', { agentCert: () => other });
    expect((await failureOf(t.open())).code).toBe('GW_ERR_E2E_AGENT');
    expect(t.p.counts.classic).toBe(0);
  });

  it("auto: the agent's refusal and the Proxy's refusal are errors, never the classic route", async () => {
    const refusing = await open('auto', {
      agentCert: () => agent1,
      onE2E: (s) => writeJsonLine(s, { ok: false, error: { code: 'GW_ERR_ACCESS_LOCKED', message: 'user alice is locked' } }),
    });
    expect((await failureOf(refusing.open())).code).toBe('GW_ERR_ACCESS_LOCKED');
    expect(refusing.p.counts.classic).toBe(0);
    const denied = await open('auto', { onGrant: (req, s) => writeJsonLine(s, { id: req.id, ok: false, error: { code: 'GW_ERR_ACCESS_DENIED', message: 'no' } }) });
    expect((await failureOf(denied.open())).code).toBe('GW_ERR_ACCESS_DENIED');
    expect(denied.p.counts.classic).toBe(0);
  });

  it('a route this version has no end-to-end stream for: classic under auto, GW_ERR_E2E_UNAVAILABLE under require', async () => {
    const p = await proxyWith({ agentCert: () => agent1 });
    const make = (mode: E2EMode) => {
      const s = new E2EStreams({ profile: profileFor(pki, p.address), dialer: dialer(), mode, classicAddress: p.address, e2eAddress: p.address });
      closers.push(() => s.close());
      return s;
    };
    // The fake Proxy's classic route takes only gateway-tcp: the auto case is checked by what it tried first.
    const err = await failureOf(make('require').open({ alpn: 'gateway-cassandra', resource: 'c1' }));
    expect(err.code).toBe('GW_ERR_E2E_UNAVAILABLE');
    expect(err.message).toMatch(/no end-to-end streams for the route gateway-cassandra/);
    await make('auto').open({ alpn: 'gateway-cassandra', resource: 'c1' }).then((o) => o.stream.destroy(), () => undefined);
    expect(p.counts.grant).toBe(0);
  });

  it("the agent's DialAnswer with framed: true: the stream is read as frames (the agent's end is said in the stream)", async () => {
    // Without frames a FIN the Proxy sends (killed, or hostile) would read as the agent's clean end.
    const p = await proxyWith({
      agentCert: () => agent1,
      onE2E: (s) => {
        writeJsonLine(s, { ok: true, framed: true });
        // One data frame ("hi"), then the end frame (length 0): src/stream/framed.ts.
        s.write(Buffer.concat([Buffer.from([0, 0, 0, 2]), Buffer.from('hi'), Buffer.alloc(4)]));
      },
    });
    const r = await connectE2E(profileFor(pki, p.address), dialer(), p.address, grantOf(), 'app');
    if (!r.ok) throw new Error(r.reason);
    closers.push(() => r.stream.destroy());
    const [chunk] = (await once(r.stream, 'data')) as [Buffer];
    expect(chunk.toString()).toBe('hi');
    expect(r.stream).toBeInstanceOf(FramedStream);
  });

  it('an agent end that offers only TLS 1.2: no end-to-end stream, even with the classic routes\' context (which allows 1.2)', async () => {
    const p = await proxyWith({ agentCert: () => agent1, maxVersion: 'TLSv1.2' });
    const profile = profileFor(pki, p.address);
    const streams = new E2EStreams({ profile, dialer: dialer(), mode: 'require', classicAddress: p.address, e2eAddress: p.address, secureContext: resourceTlsContext(profile) });
    closers.push(() => streams.close());
    const err = await failureOf(streams.open({ alpn: 'gateway-tcp', resource: 'echo', kind: 'app' }));
    expect(err.code).toBe('GW_ERR_E2E_UNAVAILABLE');
    expect(err.message).toMatch(/before the agent answered.*(protocol|version)/i);
    expect(p.counts.e2e).toBe(0);
  });

  it('off: never asks for a grant', async () => {
    const t = await open('off', { agentCert: () => agent1 });
    const o = await t.open();
    closers.push(() => o.stream.destroy());
    expect(o.e2e).toBe(false);
    expect(t.p.counts).toEqual({ grant: 0, e2e: 0, classic: 1 });
  });
});
