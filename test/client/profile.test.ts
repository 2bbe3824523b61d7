/** The CAs gwsh keeps per Proxy address (known_cas.json): kept across logout, replaced by a newer one, bounded. */
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { knownCa, rememberCa, removeProfile } from '../../src/client/profile.js';

const fresh = () => mkdtempSync(join(tmpdir(), 'gw-profile-'));

describe('known CAs', () => {
  it('keeps one CA per proxy address; a newer one replaces it', () => {
    const dir = fresh();
    rememberCa(dir, 'proxy.example.com:443', 'a.example', 'CA-1');
    rememberCa(dir, 'other.example.com:443', 'b.example', 'CA-B');
    rememberCa(dir, 'proxy.example.com:443', 'a.example', 'CA-2');
    expect(knownCa(dir, 'proxy.example.com:443')).toEqual({ cluster: 'a.example', host_ca: 'CA-2' });
    expect(knownCa(dir, 'other.example.com:443')).toEqual({ cluster: 'b.example', host_ca: 'CA-B' });
    expect(knownCa(dir, 'proxy.example.com:3080')).toBeUndefined();
    expect(knownCa(dir, 'constructor')).toBeUndefined();
  });

  it('survives logout (removeProfile removes credentials only)', () => {
    const dir = fresh();
    rememberCa(dir, 'proxy.example.com:443', 'a.example', 'CA-1');
    writeFileSync(join(dir, 'profile.json'), '{}');
    writeFileSync(join(dir, 'key.pem'), 'secret');
    expect(removeProfile(dir)).toBe(true);
    expect(existsSync(join(dir, 'key.pem'))).toBe(false);
    expect(knownCa(dir, 'proxy.example.com:443')?.host_ca).toBe('CA-1');
  });

  it('keeps at most 64 addresses, dropping the oldest, and ignores a damaged file', () => {
    const dir = fresh();
    for (let i = 0; i < 70; i++) rememberCa(dir, `p${i}.example.com:443`, 'c', `CA-${i}`);
    const kept = Object.keys(JSON.parse(readFileSync(join(dir, 'known_cas.json'), 'utf8')) as object);
    expect(kept).toHaveLength(64);
    expect(kept[0]).toBe('p6.example.com:443');
    expect(knownCa(dir, 'p69.example.com:443')?.host_ca).toBe('CA-69');
    writeFileSync(join(dir, 'known_cas.json'), '{not json');
    expect(knownCa(dir, 'p69.example.com:443')).toBeUndefined();
    writeFileSync(join(dir, 'known_cas.json'), JSON.stringify({ 'x.example.com:443': { cluster: 1, host_ca: 'CA' } }));
    expect(knownCa(dir, 'x.example.com:443')).toBeUndefined();
  });
});
