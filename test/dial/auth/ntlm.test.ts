/**
 * NTLMv2 message encoding (src/dial/auth/ntlmv2.ts), MD4 (src/dial/auth/md4.ts) and the NTLM scheme's steps
 * (src/dial/auth/ntlm.ts) against published test vectors: RFC 1320's
 * MD4 suite and MS-NLMP's NTLMv2 example (section 4.2.4: user "User", domain "Domain", password "Password",
 * server challenge 0123456789abcdef, client challenge aa*8, time 0). The hostile challenges a lying proxy could
 * send each get GW_ERR_DIAL_PROXY_NTLM_CHALLENGE and no answer. The real-server check is test/dial/lab-ntlm.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { base64Token, parseChallenges } from '../../../src/dial/auth/challenge.js';
import { md4 } from '../../../src/dial/auth/md4.js';
import { ntlmScheme, ntlmSession } from '../../../src/dial/auth/ntlm.js';
import {
  encodeAuthenticate, encodeNegotiate, MAX_AV_PAIRS, ntlmCredentials, ntlmv2Responses, ntowfv2, parseChallenge,
} from '../../../src/dial/auth/ntlmv2.js';
import type { ProxySpec } from '../../../src/dial/select.js';
import { codeOfSync } from '../../helpers/errors.js';

const hex = (s: string) => Buffer.from(s.replace(/\s+/g, ''), 'hex');

describe('MD4 (RFC 1320 appendix A.5)', () => {
  it.each([
    ['', '31d6cfe0d16ae931b73c59d7e0c089c0'],
    ['a', 'bde52cb31de33e46245e05fbdbd6fb24'],
    ['abc', 'a448017aaf21d8525fc10ae87aa6729d'],
    ['message digest', 'd9130a8164549fe818874806e1c7014b'],
    ['abcdefghijklmnopqrstuvwxyz', 'd79e1c308aa5bbcdeea8ed63df412da9'],
    ['ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789', '043f8582f241db351ce627e153e7f0e4'],
    ['1234567890'.repeat(8), 'e33b4ddc9c38f2199c3e7b164fcc0536'],
  ])('md4(%j)', (input, digest) => {
    expect(md4(Buffer.from(input)).toString('hex')).toBe(digest);
  });

  it('pads across a block boundary (55, 56 and 64 bytes)', () => {
    // The NT hash of a password is MD4 of its UTF-16LE form; 28 characters are 56 bytes, the padding's edge.
    for (const n of [55, 56, 64, 119, 120]) expect(md4(Buffer.alloc(n, 0x61)).length).toBe(16);
    expect(md4(Buffer.from('Password', 'utf16le')).toString('hex')).toBe('a4f49c406510bdcab6824ee7c30fd852'); // MS-NLMP 4.2.2.1.2 NTOWFv1
  });
});

// MS-NLMP 4.2.4.3: the CHALLENGE_MESSAGE of the NTLMv2 example.
const SPEC_CHALLENGE = Buffer.concat([
  // signature, type 2, target name (12 bytes at 0x38), flags e28a8233, server challenge, reserved,
  // target info (36 bytes at 0x44), version 6.0.6000 NTLMSSP 15
  hex('4e544c4d53535000 02000000 0c000c0038000000 33828ae2 0123456789abcdef 0000000000000000 2400240044000000 060070170000000f'),
  Buffer.from('Server', 'utf16le'),
  hex('02000c00'), Buffer.from('Domain', 'utf16le'), hex('01000c00'), Buffer.from('Server', 'utf16le'), hex('00000000'),
]);
const SPEC_CREDENTIALS = { user: 'User', domain: 'Domain', password: 'Password' };

describe('NTLMv2 (MS-NLMP 4.2.4)', () => {
  it('parses the example challenge', () => {
    const ch = parseChallenge(SPEC_CHALLENGE);
    expect(ch.serverChallenge.toString('hex')).toBe('0123456789abcdef');
    expect(ch.targetName).toBe('Server');
    expect(ch.targetInfo.length).toBe(36);
    expect(ch.timestamp).toBeUndefined();
  });

  it('NTOWFv2, the NTLMv2 and LMv2 responses and the session base key are the spec\'s', () => {
    expect(ntowfv2(SPEC_CREDENTIALS).toString('hex')).toBe('0c868a403bfd7a93a3001ef22ef02e3f');
    const r = ntlmv2Responses(SPEC_CREDENTIALS, parseChallenge(SPEC_CHALLENGE), Buffer.alloc(8), Buffer.alloc(8, 0xaa));
    expect(r.ntProofStr.toString('hex')).toBe('68cd0ab851e51c96aabc927bebef6a1c');
    expect(r.lm.toString('hex')).toBe('86c35097ac9cec102554764a57cccc19aaaaaaaaaaaaaaaa');
    expect(r.sessionBaseKey.toString('hex')).toBe('8de40ccadbc14a82f15cb0ad0de95ca3');
    // The blob: 0x0101, reserved, the time, the client challenge, reserved, the server's target info, reserved.
    expect(r.nt.subarray(16).toString('hex')).toBe(`0101000000000000${'00'.repeat(8)}${'aa'.repeat(8)}00000000${parseChallenge(SPEC_CHALLENGE).targetInfo.toString('hex')}00000000`);
  });

  it('answers Z(24) as the LM response when the proxy sent a timestamp, and uses that timestamp', () => {
    const info = Buffer.concat([hex('07000800'), hex('1122334455667788'), hex('00000000')]);
    const ch = { ...parseChallenge(SPEC_CHALLENGE), targetInfo: info, timestamp: hex('1122334455667788') };
    const msg = encodeAuthenticate(ch, SPEC_CREDENTIALS, { clientChallenge: Buffer.alloc(8, 0xaa), time: Buffer.alloc(8) });
    const lm = msg.subarray(msg.readUInt32LE(16), msg.readUInt32LE(16) + msg.readUInt16LE(12));
    expect(lm).toEqual(Buffer.alloc(24));
    const nt = msg.subarray(msg.readUInt32LE(24), msg.readUInt32LE(24) + msg.readUInt16LE(20));
    expect(nt.subarray(24, 32).toString('hex')).toBe('1122334455667788');
  });

  it('lays out the Type 3 message: fields inside it, Unicode strings, NTLMv2 only, no session key', () => {
    const msg = encodeAuthenticate(parseChallenge(SPEC_CHALLENGE), SPEC_CREDENTIALS, { clientChallenge: Buffer.alloc(8, 0xaa), time: Buffer.alloc(8), workstation: 'COMPUTER' });
    expect(msg.subarray(0, 12).toString('hex')).toBe('4e544c4d5353500003000000');
    const at = (i: number) => msg.subarray(msg.readUInt32LE(16 + i * 8), msg.readUInt32LE(16 + i * 8) + msg.readUInt16LE(12 + i * 8));
    expect(at(1).length).toBeGreaterThan(24); // an NTLMv2 response, never the 24-byte NTLMv1 one
    expect(at(1).subarray(0, 16).toString('hex')).toBe('68cd0ab851e51c96aabc927bebef6a1c');
    expect(at(2).toString('utf16le')).toBe('Domain');
    expect(at(3).toString('utf16le')).toBe('User');
    expect(at(4).toString('utf16le')).toBe('COMPUTER');
    expect(at(5).length).toBe(0);
    expect(msg.length).toBe(64 + 24 + at(1).length + 12 + 8 + 16);
  });

  it('encodes the Type 1 message with no domain or workstation', () => {
    const msg = encodeNegotiate();
    expect(msg.length).toBe(32);
    expect(msg.toString('base64').startsWith('TlRMTVNTUAABAAAA')).toBe(true);
    expect(msg.readUInt16LE(16)).toBe(0);
    expect(msg.readUInt16LE(24)).toBe(0);
  });
});

describe('hostile challenges: a clear error, no answer', () => {
  const withInfo = (info: Buffer) => {
    const msg = Buffer.concat([SPEC_CHALLENGE.subarray(0, 68), info]);
    msg.writeUInt16LE(info.length, 40);
    msg.writeUInt16LE(info.length, 42);
    return msg;
  };
  it.each<[string, () => Buffer]>([
    ['too short', () => SPEC_CHALLENGE.subarray(0, 31)],
    ['no signature', () => Buffer.concat([Buffer.from('NTLMSSX\0'), SPEC_CHALLENGE.subarray(8)])],
    ['a Type 3 message instead', () => { const m = Buffer.from(SPEC_CHALLENGE); m.writeUInt32LE(3, 8); return m; }],
    ['a target name outside the message', () => { const m = Buffer.from(SPEC_CHALLENGE); m.writeUInt32LE(0xfffffff0, 16); return m; }],
    ['a target info longer than the message', () => { const m = Buffer.from(SPEC_CHALLENGE); m.writeUInt16LE(0xffff, 40); return m; }],
    ['a target info flag without the field', () => SPEC_CHALLENGE.subarray(0, 40)],
    ['target info without MsvAvEOL', () => withInfo(hex('01000400 41004200'))],
    ['an AV pair running past the list', () => withInfo(hex('01002000 4100 00000000'))],
    ['bytes after MsvAvEOL', () => withInfo(hex('00000000 01000000'))],
    ['a 4-byte timestamp', () => withInfo(hex('07000400 11223344 00000000'))],
    ['more AV pairs than the bound', () => withInfo(Buffer.concat([...Array.from({ length: MAX_AV_PAIRS + 1 }, () => hex('0a000000')), hex('00000000')]))],
    ['larger than the bound', () => withInfo(Buffer.concat([hex('0a00f00f'), Buffer.alloc(0x0ff0), hex('00000000')]))],
  ])('%s', (_name, make) => {
    expect(codeOfSync(() => parseChallenge(make()))).toBe('GW_ERR_DIAL_PROXY_NTLM_CHALLENGE');
  });
});

describe('the NTLM scheme on one connection', () => {
  const creds = ntlmCredentials('Domain\\User', 'Password');

  it('takes DOMAIN\\user or a bare user, and refuses an empty or oversized one', () => {
    expect(creds).toEqual(SPEC_CREDENTIALS);
    expect(ntlmCredentials('bob', 'pw')).toEqual({ user: 'bob', domain: '', password: 'pw' });
    expect(codeOfSync(() => ntlmCredentials('DOM\\', 'pw'))).toBe('GW_ERR_DIAL_PROXY_NTLM_CREDENTIALS');
    expect(codeOfSync(() => ntlmCredentials('DOM\\u', 'x'.repeat(513)))).toBe('GW_ERR_DIAL_PROXY_NTLM_CREDENTIALS');
  });

  const proxy: ProxySpec = { protocol: 'http', host: 'proxy.corp', port: 3128, username: 'Domain\\User', password: 'Password', display: 'x', source: 'HTTPS_PROXY' };
  const ch = (value: string) => parseChallenges([value]);

  it('sends Type 1, answers the challenge with Type 3, and has nothing more to say to a second challenge (no loop)', async () => {
    const s = ntlmSession(proxy, { clientChallenge: Buffer.alloc(8, 0xaa), time: Buffer.alloc(8) });
    expect(await s.respond(ch('NTLM'))).toMatch(/^NTLM TlRMTVNTUAABAAAA/);
    const answer = await s.respond(ch(`NTLM ${SPEC_CHALLENGE.toString('base64')}`));
    expect(answer).toMatch(/^NTLM TlRMTVNTUAADAAAA/);
    expect(await s.respond(ch(`NTLM ${SPEC_CHALLENGE.toString('base64')}`))).toBeUndefined();
    expect(await s.respond(ch('NTLM'))).toBeUndefined();
  });

  it('a bare NTLM after Type 1 (the proxy started over) is not answered twice', async () => {
    const s = ntlmSession(proxy);
    await s.respond(ch('NTLM'));
    expect(await s.respond(ch('NTLM'))).toBeUndefined();
  });

  it('a fresh session on a new connection starts again from Type 1 (given no challenge)', async () => {
    expect(await ntlmSession(proxy).respond([])).toMatch(/^NTLM TlRMTVNTUAABAAAA/);
  });

  it('refuses a challenge that is not base64, auth-params, not a Type 2, or oversized; the password is in no message', async () => {
    for (const bad of ['NTLM abcde', 'NTLM TlRMTVNTUAACAAAA=', 'NTLM realm="x"', 'NTLM TlRMTVNTUAABAAAAB4IIogAAAAAAAAAAAAAAAAAAAAA=', `NTLM ${'A'.repeat(8192)}`]) {
      const s = ntlmSession(proxy);
      await s.respond(ch('NTLM'));
      const err = await s.respond(ch(bad)).then(() => undefined, (e: Error) => e);
      expect(err, bad).toMatchObject({ code: 'GW_ERR_DIAL_PROXY_NTLM_CHALLENGE' });
      expect(String(err)).not.toContain('Password');
    }
  });

  it('can: needs a user in the URL, and says which account it will answer as', () => {
    expect(ntlmScheme.can({ ...proxy, username: undefined, password: undefined })).toMatchObject({ ok: false, why: expect.stringContaining('DOMAIN%5Cuser') });
    expect(ntlmScheme.can(proxy)).toEqual({ ok: true, why: 'NTLMv2 as Domain\\User from the proxy URL' });
    expect(ntlmScheme.can({ ...proxy, username: 'DOM\\' })).toMatchObject({ ok: false });
  });

  it('base64Token tells a token, a bare scheme name and junk apart', () => {
    const [tok, bare, junk, params] = parseChallenges(['NTLM abcd, NTLM, NTLM abcde, NTLM a="b"']);
    expect(base64Token(tok!, 100)).toBe('abcd');
    expect(base64Token(bare!, 100)).toBeUndefined();
    expect(base64Token(junk!, 100)).toBeNull();
    expect(base64Token(params!, 100)).toBeNull();
    expect(base64Token(tok!, 3)).toBeNull();
  });
});
