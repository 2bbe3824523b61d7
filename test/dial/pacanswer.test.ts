/** The PAC answer parser (src/dial/pacanswer.ts) and where a PAC comes from (src/dial/pacspec.ts, select.ts rule 6): pure. */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { MAX_PAC_ANSWER, MAX_PAC_ENTRIES, parsePacAnswer } from '../../src/dial/pacanswer.js';
import { parsePacValue, wpadCandidates } from '../../src/dial/pacspec.js';
import { selectProxy } from '../../src/dial/select.js';
import { GatewayError } from '../../src/errors.js';
import { codeOfSync } from '../helpers/errors.js';

describe('parsePacAnswer', () => {
  it('reads each entry kind, in order, as the Dialer names it', () => {
    expect(parsePacAnswer('PROXY a.corp:3128; HTTPS b.corp:443;SOCKS5 c.corp:1080 ; SOCKS d:1; socks4 e:2; HTTP f:3; DIRECT')).toEqual([
      { kind: 'proxy', protocol: 'http', host: 'a.corp', port: 3128, text: 'PROXY a.corp:3128' },
      { kind: 'proxy', protocol: 'https', host: 'b.corp', port: 443, text: 'HTTPS b.corp:443' },
      { kind: 'proxy', protocol: 'socks5h', host: 'c.corp', port: 1080, text: 'SOCKS5 c.corp:1080' },
      { kind: 'proxy', protocol: 'socks5h', host: 'd', port: 1, text: 'SOCKS d:1' },
      { kind: 'proxy', protocol: 'socks4', host: 'e', port: 2, text: 'SOCKS4 e:2' },
      { kind: 'proxy', protocol: 'http', host: 'f', port: 3, text: 'HTTP f:3' },
      { kind: 'direct', text: 'DIRECT' },
    ]);
  });

  it('IPv6 proxies in brackets; an empty answer (or null) is DIRECT, as in browsers', () => {
    expect(parsePacAnswer('PROXY [2001:db8::1]:3128')).toEqual([{ kind: 'proxy', protocol: 'http', host: '2001:db8::1', port: 3128, text: 'PROXY [2001:db8::1]:3128' }]);
    expect(parsePacAnswer('')).toEqual([{ kind: 'direct', text: 'DIRECT' }]);
    expect(parsePacAnswer(' ; ')).toEqual([{ kind: 'direct', text: 'DIRECT' }]);
    expect(parsePacAnswer(null)).toEqual([{ kind: 'direct', text: 'DIRECT' }]);
  });

  it.each([
    ['PROXY a.corp', 'the port is missing'],
    ['PROXY', 'takes one host:port'],
    ['PROXY a:1 b:2', 'takes one host:port'],
    ['DIRECT a:1', 'DIRECT takes no address'],
    ['FTP a:21', 'is not DIRECT, PROXY'],
    ['PROXY a:99999', 'entry "PROXY a:99999"'],
    ['PROXY 2001:db8::1:80', 'entry'],
  ])('%s is an error: %s', (answer, why) => {
    let err: unknown;
    try {
      parsePacAnswer(answer);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(GatewayError);
    expect((err as GatewayError).code).toBe('GW_ERR_DIAL_PAC_ANSWER');
    expect((err as GatewayError).message).toContain(why);
  });

  it('is bounded: an answer over the size or the entry limit, or not a string, is an error', () => {
    expect(codeOfSync(() => parsePacAnswer(`PROXY a:1;${' '.repeat(MAX_PAC_ANSWER)}`))).toBe('GW_ERR_DIAL_PAC_ANSWER');
    expect(codeOfSync(() => parsePacAnswer(Array(MAX_PAC_ENTRIES + 1).fill('DIRECT').join(';')))).toBe('GW_ERR_DIAL_PAC_ANSWER');
    expect(parsePacAnswer(Array(MAX_PAC_ENTRIES).fill('DIRECT').join(';'))).toHaveLength(MAX_PAC_ENTRIES);
    expect(codeOfSync(() => parsePacAnswer(42))).toBe('GW_ERR_DIAL_PAC_ANSWER');
  });

  it('any string gives entries or GW_ERR_DIAL_PAC_ANSWER, nothing else', () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 300 }), (s) => {
        const code = codeOfSync(() => parsePacAnswer(s));
        expect(['no error', 'GW_ERR_DIAL_PAC_ANSWER']).toContain(code);
      }),
    );
  });
});

describe('where the PAC comes from', () => {
  it('pac+http, pac+https and pac+file name a PAC file; a password is never shown', () => {
    expect(parsePacValue('pac+http://wpad.corp/proxy.pac', 'HTTPS_PROXY')).toEqual({ kind: 'url', url: 'http://wpad.corp/proxy.pac', display: 'pac+http://wpad.corp/proxy.pac', source: 'HTTPS_PROXY' });
    expect(parsePacValue('PAC+https://u:s3cret@pac.corp/p.pac', 'https_proxy').display).toBe('PAC+https://u:***@pac.corp/p.pac');
    expect(parsePacValue('pac+file:///etc/proxy.pac', 'HTTPS_PROXY').url).toBe('file:///etc/proxy.pac');
  });

  it.each(['pac+ftp://a/p.pac', 'pac+file://host/p.pac', 'pac+file:///', 'pac+nonsense', 'pac+http://'])('%s is GW_ERR_DIAL_PROXY_ENV', (v) => {
    expect(codeOfSync(() => parsePacValue(v, 'HTTPS_PROXY'))).toBe('GW_ERR_DIAL_PROXY_ENV');
  });

  it('selectProxy: a pac+ value decides through the PAC, after loopback and NO_PROXY', () => {
    const env = { HTTPS_PROXY: 'pac+http://wpad.corp/proxy.pac', NO_PROXY: '.internal' };
    const d = selectProxy('proxy.example.com:443', env);
    expect(d.proxy).toBeNull();
    expect(d.pac).toMatchObject({ kind: 'url', url: 'http://wpad.corp/proxy.pac' });
    expect(d.source).toBe('HTTPS_PROXY');
    expect(d.reason).toContain('names the PAC file pac+http://wpad.corp/proxy.pac');
    expect(selectProxy('db.internal:5432', env).pac).toBeUndefined();
    expect(selectProxy('localhost:443', env).pac).toBeUndefined();
  });

  it('selectProxy: GATEWAY_WPAD=1 asks for WPAD only when no proxy variable is set', () => {
    expect(selectProxy('proxy.example.com:443', { GATEWAY_WPAD: '1' })).toMatchObject({ proxy: null, pac: { kind: 'wpad' }, source: 'GATEWAY_WPAD' });
    expect(selectProxy('proxy.example.com:443', { GATEWAY_WPAD: '1', HTTPS_PROXY: 'http://squid.corp:3128' })).toMatchObject({ proxy: { host: 'squid.corp' }, source: 'HTTPS_PROXY' });
    expect(selectProxy('proxy.example.com:443', { GATEWAY_WPAD: '0' }).pac).toBeUndefined();
    expect(selectProxy('proxy.example.com:443', {}).pac).toBeUndefined();
  });

  it('wpadCandidates: the last search (or domain) line, each domain then its parents down to two labels, no repeats', () => {
    const conf = 'nameserver 10.0.0.1\ndomain old.example\nsearch eu.corp.example.com corp.example.com lab.test.\noptions ndots:2\n';
    expect(wpadCandidates(conf)).toEqual([
      'http://wpad.eu.corp.example.com/wpad.dat',
      'http://wpad.corp.example.com/wpad.dat',
      'http://wpad.example.com/wpad.dat',
      'http://wpad.lab.test/wpad.dat',
    ]);
    expect(wpadCandidates('search com\n')).toEqual([]);
    expect(wpadCandidates('nameserver 1.1.1.1\n')).toEqual([]);
    expect(wpadCandidates('search bad..name ok.test\n')).toEqual(['http://wpad.ok.test/wpad.dat']);
  });
});
