/**
 * Digest answers checked against RFC 7616's own examples (section 3.9.1, MD5 and SHA-256; section 3.9.2,
 * SHA-512-256 with userhash), and the session's rules: the strongest algorithm of several challenges, one more
 * answer only on stale=true, challenges it cannot answer declined.
 */
import { describe, expect, it } from 'vitest';
import { parseChallenges, type Challenge } from '../../../src/dial/auth/challenge.js';
import { digestResponse, digestScheme } from '../../../src/dial/auth/digest.js';
import type { ProxySpec } from '../../../src/dial/select.js';

const one = (header: string): Challenge => parseChallenges([header])[0]!;
/** The auth-params of a Proxy-Authorization value, as a map (its syntax is a challenge's). */
const params = (value: string) => one(value).params;

const RFC_391 = {
  username: 'Mufasa',
  password: 'Circle of Life',
  method: 'GET',
  uri: '/dir/index.html',
  nc: 1,
  cnonce: 'f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ',
};
const CHALLENGE_391 =
  'Digest realm="http-auth@example.org", qop="auth, auth-int", algorithm=%s, nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"';

describe('Digest response (RFC 7616 examples)', () => {
  it('MD5 (section 3.9.1)', () => {
    const v = digestResponse({ ...RFC_391, challenge: one(CHALLENGE_391.replace('%s', 'MD5')) });
    const p = params(v);
    expect(p.get('response')).toBe('8ca523f5e9506fed4657c9700eebdbec');
    expect(p.get('username')).toBe('Mufasa');
    expect(p.get('qop')).toBe('auth');
    expect(p.get('nc')).toBe('00000001');
    expect(p.get('opaque')).toBe('FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS');
    expect(p.get('algorithm')).toBe('MD5');
  });

  it('SHA-256 (section 3.9.1)', () => {
    const v = digestResponse({ ...RFC_391, challenge: one(CHALLENGE_391.replace('%s', 'SHA-256')) });
    expect(params(v).get('response')).toBe('753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1');
  });

  it('SHA-512-256 with userhash (section 3.9.2)', () => {
    const challenge = one(
      'Digest realm="api@example.org", qop="auth", algorithm=SHA-512-256, nonce="5TsQWLVdgBdmrQ0XsxbDODV+57QdFR34I9HAbC/RVvkK", ' +
        'opaque="HRPCssKJSGjCrkzDg8OhwpzCiGPChXYjwrI2QmXDnsOS", charset=UTF-8, userhash=true',
    );
    const v = digestResponse({
      username: 'J\u00e4s\u00f8n Doe',
      password: 'Secret, or not?',
      method: 'GET',
      uri: '/doe.json',
      nc: 1,
      cnonce: 'NTg6RKcb9boFIAS3KrFK9BGeh+iDa/sm6jUMp2wds69v',
      challenge,
    });
    const p = params(v);
    expect(p.get('username')).toBe('793263caabb707a56211940d90411ea4a575adeccb7e360aeb624ed06ece9b0b');
    expect(p.get('response')).toBe('3798d4131c277846293534c3edc11bd8a5e4cdcbff78b05db9d95eeb1cec68a5');
    expect(p.get('userhash')).toBe('true');
  });

  it('the RFC 2069 form when the challenge has no qop, and MD5 when it names no algorithm', () => {
    // RFC 2069 section 2.4's example: Mufasa / CircleOfLife, GET /dir/index.html.
    const challenge = one('Digest realm="testrealm@host.com", nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", opaque="5ccc069c403ebaf9f0171e9517f40e41"');
    const v = digestResponse({ username: 'Mufasa', password: 'CircleOfLife', method: 'GET', uri: '/dir/index.html', nc: 1, cnonce: 'x', challenge });
    const p = params(v);
    expect(p.get('response')).toBe('1949323746fe6a43ef61f9606e7febea');
    expect(p.has('qop')).toBe(false);
    expect(p.has('nc')).toBe(false);
    expect(p.has('algorithm')).toBe(false);
  });

  it('escapes quotes in the user name and uses username* for one outside ASCII', () => {
    const challenge = one('Digest realm="r", nonce="n", qop=auth');
    const quoted = digestResponse({ ...RFC_391, username: 'a"b\\c', challenge });
    expect(quoted).toContain('username="a\\"b\\\\c"');
    expect(params(quoted).get('username')).toBe('a"b\\c');
    const utf8 = digestResponse({ ...RFC_391, username: 'J\u00e4s\u00f8n', challenge });
    expect(utf8).toContain("username*=UTF-8''J%C3%A4s%C3%B8n");
  });
});

describe('Digest session', () => {
  const proxy: ProxySpec = { protocol: 'http', host: 'p', port: 3128, username: 'alice', password: 'pw', display: 'http://alice:***@p:3128', source: 'HTTPS_PROXY' };
  const request = { method: 'CONNECT' as const, uri: 'proxy.example.com:443' };

  it('answers the strongest algorithm of several challenges', async () => {
    const session = digestScheme.start(proxy, request);
    const v = await session.respond(parseChallenges(['Digest realm="r", nonce="a", qop=auth, algorithm=MD5', 'Digest realm="r", nonce="b", qop=auth, algorithm=SHA-256']));
    expect(params(v!).get('algorithm')).toBe('SHA-256');
    expect(params(v!).get('nonce')).toBe('b');
    expect(params(v!).get('uri')).toBe('proxy.example.com:443');
  });

  it('answers a second time only when the nonce was stale, and never a third', async () => {
    const session = digestScheme.start(proxy, request);
    expect(await session.respond([one('Digest realm="r", nonce="a", qop=auth')])).toBeDefined();
    expect(await session.respond([one('Digest realm="r", nonce="b", qop=auth, stale=true')])).toContain('nonce="b"');
    expect(await session.respond([one('Digest realm="r", nonce="c", qop=auth, stale=true')])).toBeUndefined();
    const refused = digestScheme.start(proxy, request);
    await refused.respond([one('Digest realm="r", nonce="a", qop=auth')]);
    expect(await refused.respond([one('Digest realm="r", nonce="b", qop=auth, stale=false')])).toBeUndefined();
  });

  it.each([
    ['Digest realm="r", nonce="n", algorithm=SHA-1', false],
    ['Digest realm="r", nonce="n", qop="auth-int"', false],
    ['Digest realm="r"', false],
    ['Digest nonce="n"', false],
    ['Digest realm="r", nonce="n", algorithm=sha-256-sess, qop="auth-int,auth"', true],
    ['Digest realm="r", nonce="n"', true],
  ])('accepts(%s) is %s', (header, ok) => {
    expect(digestScheme.accepts(one(header))).toBe(ok);
  });

  it('cannot answer without credentials in the URL', () => {
    expect(digestScheme.can({ ...proxy, username: undefined, password: undefined }).ok).toBe(false);
  });
});
