/**
 * The multiplexer believes a PROXY header only from the sources it is given (src/mux/trust.ts decides), with real
 * sockets on loopback: each client binds its own loopback address (127.0.0.2, 127.0.0.3, ...) as its source, so
 * one machine has a trusted balancer and untrusted attackers side by side. Hostile: an attacker with a socket
 * sends a header naming an address of its choice (a victim's), alone, in a flood, and through a dual-stack
 * listener where its source arrives IPv4-mapped. What it must not get: routed, or its chosen address seen by
 * the route, the source caps or the refusal log; what it must get: closed, counted and logged under its real
 * address, at a bounded number of lines.
 *
 * The route is a raw one (first bytes "SSH-"): what the route was handed is the multiplexer's whole decision.
 */
import { once } from 'node:events';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pino } from 'pino';
import { Multiplexer, type ConnInfo } from '../../src/mux/multiplexer.js';
import { buildProxyHeaderV1, buildProxyHeaderV2 } from '../../src/mux/proxyproto.js';

const BALANCER = '127.0.0.2';
const ATTACKER = '127.0.0.3';
/** In the listed network 127.0.0.16/28. */
const OTHER_BALANCER = '127.0.0.20';
const VICTIM = '198.51.100.77';
const SSH_LINE = 'SSH-2.0-test\r\n';

interface Door {
  mux: Multiplexer;
  server: net.Server;
  port: number;
  seen: ConnInfo[];
  logs: Array<Record<string, unknown>>;
}

const doors: Door[] = [];

async function startDoor(host: string, trusted: readonly string[] | undefined): Promise<Door> {
  const seen: ConnInfo[] = [];
  const logs: Array<Record<string, unknown>> = [];
  const log = pino({ level: 'debug' }, { write: (line: string) => void logs.push(JSON.parse(line) as Record<string, unknown>) });
  const mux = new Multiplexer({
    routes: [
      {
        name: 'ssh',
        match: { sniffed: 'ssh' },
        handler: (stream, info) => {
          seen.push(info);
          stream.end(`${info.remoteAddress}\n`);
        },
      },
    ],
    proxyProtocol: true,
    ...(trusted ? { proxyProtocolTrusted: trusted } : {}),
    detectTimeoutMs: 5_000,
    log,
  });
  const server = net.createServer(mux.handleSocket);
  server.listen(0, host);
  await once(server, 'listening');
  const door = { mux, server, port: (server.address() as net.AddressInfo).port, seen, logs };
  doors.push(door);
  return door;
}

/**
 * Connects from `source` to the door, writes `bytes`, and resolves with what came back and how it ended:
 * 'answered' (the route wrote the address it saw) or 'closed' (nothing came back).
 */
function attempt(door: Door, source: string, bytes: Buffer | string, host = '127.0.0.1'): Promise<{ outcome: 'answered' | 'closed'; body: string }> {
  return new Promise((resolve) => {
    const s = net.connect({ host, port: door.port, localAddress: source });
    let body = '';
    s.on('data', (c: Buffer) => (body += c.toString()));
    s.on('error', () => undefined);
    s.on('close', () => resolve({ outcome: body === '' ? 'closed' : 'answered', body: body.trim() }));
    s.on('connect', () => s.write(bytes));
  });
}

const v1 = (client: string) => Buffer.concat([buildProxyHeaderV1({ family: 'tcp4', source: { address: client, port: 40000 }, destination: { address: '10.0.0.1', port: 443 } }), Buffer.from(SSH_LINE)]);
const v2 = (client: string) => Buffer.concat([buildProxyHeaderV2({ command: 'PROXY', family: 'tcp4', source: { address: client, port: 40000 }, destination: { address: '10.0.0.1', port: 443 } }), Buffer.from(SSH_LINE)]);

let listed: Door;
let open: Door;

beforeAll(async () => {
  listed = await startDoor('127.0.0.1', [BALANCER, '127.0.0.16/28']);
  open = await startDoor('127.0.0.1', undefined);
});

afterAll(async () => {
  for (const d of doors) d.server.close();
});

describe('with trusted sources listed', () => {
  it('an attacker at an unlisted source sending a header naming a victim: closed, counted, logged under its real address', async () => {
    const before = listed.mux.getStats().refused['proxy-protocol-untrusted-source'] ?? 0;
    const seenBefore = listed.seen.length;
    for (const bytes of [v1(VICTIM), v2(VICTIM)]) {
      expect(await attempt(listed, ATTACKER, bytes)).toEqual({ outcome: 'closed', body: '' });
    }
    expect(listed.seen.length).toBe(seenBefore);
    expect(listed.mux.getStats().refused['proxy-protocol-untrusted-source']).toBe(before + 2);
    const lines = listed.logs.filter((l) => l.reason === 'proxy-protocol-untrusted-source');
    expect(lines.length).toBeGreaterThanOrEqual(2);
    for (const l of lines) {
      expect(l).toMatchObject({ msg: 'connection refused', code: 'GW_ERR_MUX_PROXY_HEADER_UNTRUSTED', level: 40 });
      expect(String(l.client)).toMatch(new RegExp(`^${ATTACKER.replaceAll('.', '\\.')}:`));
    }
    expect(JSON.stringify(listed.logs)).not.toContain(VICTIM);
  });

  it('the listed balancer (a single address, and one inside a listed network): the route sees the client the header names', async () => {
    expect(await attempt(listed, BALANCER, v2('203.0.113.5'))).toEqual({ outcome: 'answered', body: '203.0.113.5' });
    expect(await attempt(listed, OTHER_BALANCER, v1('203.0.113.6'))).toEqual({ outcome: 'answered', body: '203.0.113.6' });
  });

  it('a connection without a header is served under its own address, listed or not (the header stays optional)', async () => {
    expect(await attempt(listed, ATTACKER, SSH_LINE)).toEqual({ outcome: 'answered', body: ATTACKER });
    expect(await attempt(listed, BALANCER, SSH_LINE)).toEqual({ outcome: 'answered', body: BALANCER });
  });

  it('a flood of spoofed headers: every one closed and counted, at most 60 log lines a minute', async () => {
    const before = listed.mux.getStats().refused['proxy-protocol-untrusted-source'] ?? 0;
    const logged = listed.logs.length;
    const results = await Promise.all(Array.from({ length: 200 }, (_, i) => attempt(listed, ATTACKER, v1(`198.51.100.${i}`))));
    expect(results.every((r) => r.outcome === 'closed')).toBe(true);
    expect(listed.mux.getStats().refused['proxy-protocol-untrusted-source']).toBe(before + 200);
    // The refusal log holds 60 lines a minute, shared with the refusals of the tests before.
    expect(listed.logs.length - logged).toBeLessThanOrEqual(60);
    expect(listed.logs.filter((l) => l.msg === 'connection refused').length).toBeLessThanOrEqual(60);
    expect(listed.mux.getStats().detecting).toBe(0);
  });
});

describe('the refusal log under a flood of noise', () => {
  it('200 garbage connections use up their own budget of lines, not that of spoofed headers', async () => {
    const door = await startDoor('127.0.0.1', [BALANCER]);
    const garbage = await Promise.all(Array.from({ length: 200 }, () => attempt(door, ATTACKER, 'GARBAGE!\r\n')));
    expect(garbage.every((r) => r.outcome === 'closed')).toBe(true);
    expect(door.mux.getStats().refused['unknown-protocol']).toBe(200);
    expect(door.logs.filter((l) => l.reason === 'unknown-protocol').length).toBeLessThanOrEqual(60);
    expect(await attempt(door, ATTACKER, v2(VICTIM))).toEqual({ outcome: 'closed', body: '' });
    expect(door.logs.filter((l) => l.reason === 'proxy-protocol-untrusted-source')).toHaveLength(1);
  });
});

describe('a dual-stack listener (::)', () => {
  it('an IPv4 balancer arrives as ::ffff:a.b.c.d and matches its IPv4 entry; an IPv4 attacker does not', async () => {
    let dual: Door;
    try {
      dual = await startDoor('::', [BALANCER]);
    } catch (err) {
      throw new Error(`this test needs an IPv6-capable loopback (a dual-stack listener on ::): ${(err as Error).message}`);
    }
    expect(await attempt(dual, BALANCER, v1('203.0.113.7'))).toEqual({ outcome: 'answered', body: '203.0.113.7' });
    expect(await attempt(dual, ATTACKER, v1(VICTIM))).toEqual({ outcome: 'closed', body: '' });
    expect(await attempt(dual, ATTACKER, SSH_LINE)).toEqual({ outcome: 'answered', body: `::ffff:${ATTACKER}` });
    expect(dual.mux.getStats().refused['proxy-protocol-untrusted-source']).toBe(1);
  });
});

describe('a new list (SIGHUP)', () => {
  it('judges the headers that arrive from then on: a balancer taken out is refused, one added is believed', async () => {
    const door = await startDoor('127.0.0.1', [BALANCER]);
    expect(await attempt(door, BALANCER, v1('203.0.113.8'))).toEqual({ outcome: 'answered', body: '203.0.113.8' });
    expect(door.mux.setProxyProtocolTrusted([OTHER_BALANCER])).toMatchObject({ mode: 'listed' });
    expect(await attempt(door, BALANCER, v1('203.0.113.8'))).toEqual({ outcome: 'closed', body: '' });
    expect(await attempt(door, OTHER_BALANCER, v1('203.0.113.9'))).toEqual({ outcome: 'answered', body: '203.0.113.9' });
    // An empty list is "any source" again; proxy_protocol off stays off whatever the list.
    expect(door.mux.setProxyProtocolTrusted([])).toEqual({ mode: 'any' });
    const off = new Multiplexer({ routes: [], proxyProtocol: false, detectTimeoutMs: 1_000 });
    expect(off.setProxyProtocolTrusted([BALANCER])).toEqual({ mode: 'off' });
  });
});

describe('without a list (compatibility)', () => {
  it('a header is believed from any source, as before', async () => {
    expect(await attempt(open, ATTACKER, v1(VICTIM))).toEqual({ outcome: 'answered', body: VICTIM });
    expect(open.mux.getStats().refused['proxy-protocol-untrusted-source']).toBeUndefined();
  });
});
