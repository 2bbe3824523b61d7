/**
 * Who may send a PROXY header (src/mux/trust.ts): the pure decision and the parsing of the operator's list.
 * Hostile inputs: a peer that is not listed, an IPv4 client behind a dual-stack listener (mapped address), a
 * peer next to a listed network, entries that would trust more than the operator meant (host bits, names,
 * zones), and a second header or one inside a connection upgrade from a listed source.
 */
import { describe, expect, it } from 'vitest';
import { AddrError } from '../../src/addr.js';
import { anySourceBelieved, decideProxyHeader, MAX_TRUSTED_SOURCES, parseTrustedSource, parseTrustedSources, proxyHeaderPolicy, trustedEntryFor } from '../../src/mux/trust.js';

const fresh = (peer: string) => ({ peer, headersTaken: 0, upgraded: false });

describe('decideProxyHeader', () => {
  const listed = proxyHeaderPolicy(true, ['10.0.0.0/8', '192.0.2.7', '2001:db8:1::/48', '::ffff:198.51.100.0/120']);

  it('off: every header is refused, from anyone', () => {
    const v = decideProxyHeader(proxyHeaderPolicy(false, ['10.0.0.0/8']), fresh('10.1.2.3'));
    expect(v).toMatchObject({ take: false, refusal: 'proxy-protocol-off' });
  });

  it('on without a list: taken from any source, and the reason says so', () => {
    const v = decideProxyHeader(proxyHeaderPolicy(true, []), fresh('203.0.113.9'));
    expect(v.take).toBe(true);
    expect(v.reason).toMatch(/any source/);
  });

  it('a listed peer is trusted, and the reason names the entry', () => {
    expect(decideProxyHeader(listed, fresh('10.200.0.1'))).toEqual({ take: true, reason: 'the peer 10.200.0.1 is trusted by the entry 10.0.0.0/8' });
    expect(decideProxyHeader(listed, fresh('192.0.2.7'))).toMatchObject({ take: true });
    expect(decideProxyHeader(listed, fresh('2001:db8:1:ffff::1'))).toMatchObject({ take: true });
  });

  it('a peer outside every entry is refused with the code, whatever it is next to', () => {
    for (const peer of ['11.0.0.1', '9.255.255.255', '192.0.2.8', '192.0.2.6', '2001:db8:2::1', '127.0.0.1', '::1', '', 'not-an-address']) {
      expect(decideProxyHeader(listed, fresh(peer)), peer).toMatchObject({ take: false, refusal: 'proxy-protocol-untrusted-source', code: 'GW_ERR_MUX_PROXY_HEADER_UNTRUSTED' });
    }
  });

  it('an IPv4 client behind a dual-stack listener (::ffff:a.b.c.d) matches the IPv4 entries, and only them', () => {
    expect(decideProxyHeader(listed, fresh('::ffff:10.9.8.7'))).toMatchObject({ take: true });
    expect(decideProxyHeader(listed, fresh('::FFFF:192.0.2.7'))).toMatchObject({ take: true });
    expect(decideProxyHeader(listed, fresh('::ffff:11.9.8.7'))).toMatchObject({ take: false });
    // ::/0 is "any IPv6 source": an IPv4 client is not one.
    const v6only = proxyHeaderPolicy(true, ['::/0']);
    expect(decideProxyHeader(v6only, fresh('::ffff:10.9.8.7'))).toMatchObject({ take: false });
    expect(decideProxyHeader(v6only, fresh('2001:db8::1'))).toMatchObject({ take: true });
  });

  it('an IPv4-mapped entry is the IPv4 network it maps', () => {
    expect(decideProxyHeader(listed, fresh('198.51.100.200'))).toMatchObject({ take: true });
    expect(decideProxyHeader(listed, fresh('::ffff:198.51.100.1'))).toMatchObject({ take: true });
    expect(decideProxyHeader(listed, fresh('198.51.101.1'))).toMatchObject({ take: false });
  });

  it('a zone on a link-local peer is dropped before matching', () => {
    expect(decideProxyHeader(proxyHeaderPolicy(true, ['fe80::/10']), fresh('fe80::1%eth0'))).toMatchObject({ take: true });
  });

  it('a second header, or one inside a connection upgrade, is refused even from a listed source', () => {
    expect(decideProxyHeader(listed, { peer: '10.0.0.1', headersTaken: 1, upgraded: false })).toMatchObject({ take: false, refusal: 'proxy-protocol-twice' });
    expect(decideProxyHeader(listed, { peer: '10.0.0.1', headersTaken: 0, upgraded: true })).toMatchObject({ take: false, refusal: 'proxy-protocol-in-upgrade' });
    expect(decideProxyHeader(proxyHeaderPolicy(true), { peer: '10.0.0.1', headersTaken: 1, upgraded: false })).toMatchObject({ take: false, refusal: 'proxy-protocol-twice' });
  });
});

describe('anySourceBelieved (the start warning)', () => {
  it('only on the one port, with proxy_protocol on and no list', () => {
    expect(anySourceBelieved({ onePort: true, proxyProtocol: true, sources: [] })).toBe(true);
    expect(anySourceBelieved({ onePort: true, proxyProtocol: true, sources: ['10.0.0.5'] })).toBe(false);
    expect(anySourceBelieved({ onePort: true, proxyProtocol: false, sources: [] })).toBe(false);
    // Separate listeners read no PROXY header at all.
    expect(anySourceBelieved({ onePort: false, proxyProtocol: true, sources: [] })).toBe(false);
  });
});

describe('parseTrustedSource', () => {
  it('single addresses and networks of both families', () => {
    expect(parseTrustedSource(' 10.0.0.5 ')).toEqual({ text: '10.0.0.5', family: 4, base: 0x0a000005n, bits: 32 });
    expect(parseTrustedSource('10.0.0.0/8')).toMatchObject({ family: 4, base: 0x0a000000n, bits: 8 });
    expect(parseTrustedSource('0.0.0.0/0')).toMatchObject({ family: 4, bits: 0 });
    expect(parseTrustedSource('2001:db8::/32')).toMatchObject({ family: 6, base: 0x20010db8n << 96n, bits: 32 });
    expect(parseTrustedSource('::1')).toMatchObject({ family: 6, base: 1n, bits: 128 });
    expect(parseTrustedSource('::ffff:10.0.0.0/104')).toMatchObject({ family: 4, base: 0x0a000000n, bits: 8 });
    expect(parseTrustedSource('::ffff:10.0.0.1')).toMatchObject({ family: 4, base: 0x0a000001n, bits: 32 });
    expect(parseTrustedSource('1:2:3:4:5:6:7:8')).toMatchObject({ base: 0x00010002000300040005000600070008n });
  });

  it('refuses what would trust more or other than meant, with a hint', () => {
    const bad = ['10.1.2.3/8', '2001:db8::1/32', 'lb.example.com', '10.0.0.5:443', '[2001:db8::1]', 'fe80::1%eth0', '10.0.0.0/33', '::/129', '10.0.0.0/', '10.0.0.0/-1', '10.0.0.0/08x', '', '   ', '10.0.0.256', 'x'.repeat(100)];
    for (const text of bad) {
      let err: unknown;
      try {
        parseTrustedSource(text);
      } catch (e) {
        err = e;
      }
      expect(err, text).toBeInstanceOf(AddrError);
      expect((err as AddrError).hint, text).toBeTruthy();
    }
  });

  it('host bits set: the hint names the network the operator probably meant', () => {
    expect(() => parseTrustedSource('10.1.2.3/8')).toThrow(AddrError);
    try {
      parseTrustedSource('10.1.2.3/8');
    } catch (e) {
      expect((e as AddrError).hint).toContain('10.0.0.0/8');
    }
    try {
      parseTrustedSource('2001:db8:0:0:1::/32');
    } catch (e) {
      expect((e as AddrError).hint).toContain('2001:db8::/32');
    }
  });

  it('the list is bounded', () => {
    expect(() => parseTrustedSources(Array.from({ length: MAX_TRUSTED_SOURCES + 1 }, (_, i) => `10.0.${i >> 8}.${i & 255}`))).toThrow(AddrError);
    expect(parseTrustedSources(Array.from({ length: MAX_TRUSTED_SOURCES }, (_, i) => `10.0.${i >> 8}.${i & 255}`))).toHaveLength(MAX_TRUSTED_SOURCES);
  });

  it('trustedEntryFor gives the first entry that holds the peer', () => {
    const list = parseTrustedSources(['10.0.0.0/8', '10.1.0.0/16']);
    expect(trustedEntryFor(list, '10.1.2.3')?.text).toBe('10.0.0.0/8');
    expect(trustedEntryFor(list, '11.1.2.3')).toBeUndefined();
  });
});
