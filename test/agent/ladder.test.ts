/**
 * The transport ladder's decisions (src/agent/ladder.ts), pure: which rungs a find answer offers and in which
 * order, which failures fall to the next rung and which stop, the reason lines, the move cap, and where an attempt
 * starts once a rung has worked. The clock is the test's; nothing here waits.
 */
import { describe, expect, it } from 'vitest';
import { betterThan, climbReason, fallReason, fallsThrough, Ladder, LADDER_MOVES, LADDER_PROBE, mayMove, rungsOf, type Rung } from '../../src/agent/ladder.js';
import { GatewayError, type ErrorCode } from '../../src/errors.js';
import type { FindResponse } from '../../src/wire/ping.js';

function find(tls: boolean, publicAddr: string, tunnelAddr: string): FindResponse {
  const ssh = { listen_addr: '', tunnel_listen_addr: '', web_listen_addr: '', public_addr: publicAddr, ssh_public_addr: '', ssh_tunnel_public_addr: tunnelAddr };
  return { proxy: { ssh, tls_routing_enabled: tls } as FindResponse['proxy'], server_version: '1', cluster_name: 'c' };
}

const err = (code: ErrorCode) => new GatewayError(code, 'x');

describe('rungsOf', () => {
  it('the one port (multiplex): alpn only, since the tunnel address is the web address', () => {
    expect(rungsOf(find(true, 'proxy.example.com:443', 'proxy.example.com:443'), 'joined:443')).toEqual([{ name: 'alpn', addr: 'proxy.example.com:443' }]);
  });

  it('separate listeners: the tunnel port only (the web port there serves the web alone)', () => {
    expect(rungsOf(find(false, 'proxy.example.com:443', 'proxy.example.com:3024'), 'joined:443')).toEqual([{ name: 'tunnel-port', addr: 'proxy.example.com:3024' }]);
  });

  it('the one port and a tunnel port of its own (tunnel_public_addr set): alpn first, then the tunnel port', () => {
    expect(rungsOf(find(true, 'proxy.example.com:443', 'proxy.example.com:3024'), 'joined:443')).toEqual([
      { name: 'alpn', addr: 'proxy.example.com:443' },
      { name: 'tunnel-port', addr: 'proxy.example.com:3024' },
    ]);
  });

  it('the upgrade rung only with an opener, last; no public address: the address the agent joined through', () => {
    expect(rungsOf(find(true, '', 'p:3024'), 'joined:443', { upgrade: true }).map((r) => `${r.name} ${r.addr}`)).toEqual(['alpn joined:443', 'tunnel-port p:3024', 'upgrade joined:443']);
    expect(rungsOf(find(true, 'p:443', 'p:443'), 'j:443', { upgrade: false }).map((r) => r.name)).toEqual(['alpn']);
  });
});

describe('fallsThrough', () => {
  it.each<ErrorCode>(['GW_ERR_DIAL_CONNECT_TIMEOUT', 'GW_ERR_DIAL_UNREACHABLE', 'GW_ERR_DIAL_PROXY_REFUSED', 'GW_ERR_TLS_INSPECTED', 'GW_ERR_TLS_HANDSHAKE_TIMEOUT', 'GW_ERR_CLIENT_UNTRUSTED', 'GW_ERR_TUNNEL_RUNG', 'GW_ERR_TUNNEL_DOWN'])(
    '%s means the path does not work from here: fall',
    (code) => expect(fallsThrough(err(code))).toBe(true),
  );

  it.each<ErrorCode>(['GW_ERR_TUNNEL_AUTH', 'GW_ERR_TLS_CERT_EXPIRED', 'GW_ERR_INTERNAL', 'GW_ERR_API_BAD_RESPONSE'])('%s is an answer no other path changes: stop', (code) => {
    expect(fallsThrough(err(code))).toBe(false);
  });
});

describe('reasons', () => {
  const alpn: Rung = { name: 'alpn', addr: 'p:443' };
  const port: Rung = { name: 'tunnel-port', addr: 'p:3024' };
  it('a fall names the rung, its address, the code and what comes next', () => {
    const line = fallReason(alpn, new GatewayError('GW_ERR_DIAL_CONNECT_TIMEOUT', 'no answer'), port);
    expect(line).toContain('alpn (TLS with ALPN on the web address, p:443) does not work from here: GW_ERR_DIAL_CONNECT_TIMEOUT: no answer');
    expect(line).toContain('trying tunnel-port (raw SSH on the reverse-tunnel port, p:3024)');
    expect(fallReason(port, err('GW_ERR_DIAL_UNREACHABLE'), undefined)).toMatch(/no rung left$/);
  });

  it('a climb names both rungs and says the old tunnel drains', () => {
    expect(climbReason('tunnel-port', alpn)).toBe('alpn (TLS with ALPN on the web address, p:443) works again: moving the tunnel up from tunnel-port; the old tunnel drains');
  });

  it('betterThan: the rungs above the current one, none on the best or an unknown one', () => {
    const rungs = [alpn, port, { name: 'upgrade' as const, addr: 'p:443' }];
    expect(betterThan(rungs, 'upgrade').map((r) => r.name)).toEqual(['alpn', 'tunnel-port']);
    expect(betterThan(rungs, 'alpn')).toEqual([]);
    expect(betterThan(rungs, undefined)).toEqual([]);
  });
});

describe('the move cap and the probe policy', () => {
  it('at most maxMoves per window: then no probe until the oldest leaves the window, and the reason says for how long', () => {
    const policy = { maxMoves: 2, windowMs: 1000 };
    expect(mayMove([], 0, policy).ok).toBe(true);
    expect(mayMove([100], 500, policy).ok).toBe(true);
    const refused = mayMove([100, 400], 500, policy);
    expect(refused.ok).toBe(false);
    expect(refused.reason).toContain('no probe for 600 ms');
    expect(mayMove([100, 400], 1100, policy).ok).toBe(true);
  });

  it('the figures the docs state: probe 1 min doubling to 15 min, reset after 30 min up; 3 moves an hour', () => {
    expect(LADDER_PROBE).toEqual({ firstMs: 60_000, maxMs: 900_000, jitter: 'equal', resetAfterMs: 1_800_000 });
    expect(LADDER_MOVES).toEqual({ maxMoves: 3, windowMs: 3_600_000 });
  });
});

describe('Ladder', () => {
  const rungs: Rung[] = [
    { name: 'alpn', addr: 'p:443' },
    { name: 'tunnel-port', addr: 'p:3024' },
  ];

  it('starts at the best rung, then at the one that worked; forget() goes back to the best', () => {
    const ladder = new Ladder();
    expect(ladder.startAt(rungs)).toBe(0);
    ladder.up('tunnel-port');
    expect(ladder.current).toBe('tunnel-port');
    expect(ladder.startAt(rungs)).toBe(1);
    ladder.forget();
    expect(ladder.startAt(rungs)).toBe(0);
  });

  it('a flapping rung: moves count against the window on the ladder clock, and the probe delay keeps growing', () => {
    let now = 0;
    const ladder = new Ladder({ probe: { firstMs: 100, maxMs: 1000, resetAfterMs: 10_000 }, moves: { maxMoves: 2, windowMs: 5000 }, deps: { now: () => now, random: () => 1 } });
    const delays = [ladder.probe.next()];
    ladder.moved('alpn');
    now += 10;
    delays.push(ladder.probe.next()); // the move was not followed by 10 s up: no reset
    ladder.moved('alpn');
    now += 10;
    delays.push(ladder.probe.next());
    expect(delays).toEqual([100, 200, 400]);
    expect(ladder.mayMove().ok).toBe(false);
    now += 5000;
    expect(ladder.mayMove().ok).toBe(true);
  });
});
