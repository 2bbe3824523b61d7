/**
 * The entry check of a release tarball (src/upgrade/tarentries.ts), before anything is extracted: archives made by
 * GNU tar pass; hand-made ones with entries that would land outside the extraction directory, links that point
 * out, devices, setuid files, too many entries or bytes, a damaged header or a truncated archive are refused with
 * GW_ERR_UPGRADE_TARBALL. checkTarballEntries runs the same check on a .tar.gz file through gunzip.
 */
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { GatewayError } from '../../src/errors.js';
import { checkTarballEntries } from '../../src/upgrade/tarball.js';
import { nameComponents, parsePax, TarScanner, type TarLimits } from '../../src/upgrade/tarentries.js';
import { paxEntry, tarEntry, tarOf, targz, type RawEntry } from './tarball-fixtures.js';

const run = promisify(execFile);

function scan(entries: Array<RawEntry | Buffer>, limits: Partial<TarLimits> = {}, chunk = 7919) {
  const s = new TarScanner(limits);
  const tar = tarOf(entries);
  // Odd chunk sizes: the reader is incremental, a header split anywhere must read the same.
  for (let i = 0; i < tar.length; i += chunk) s.push(tar.subarray(i, i + chunk));
  return s.end();
}

function refused(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(GatewayError);
    expect((err as GatewayError).code).toBe('GW_ERR_UPGRADE_TARBALL');
    expect((err as GatewayError).message).toContain('nothing was extracted or installed');
    return (err as GatewayError).message;
  }
  throw new Error('not refused');
}

const top: RawEntry = { name: 'gateway/', type: '5' };

describe('entries that stay inside pass', () => {
  it('files, directories, links inside (node_modules/.bin style), hard links to earlier files, in any chunking', () => {
    const entries: RawEntry[] = [
      top,
      { name: 'gateway/install', mode: 0o755, body: '#!/bin/sh\n' },
      { name: 'gateway/lib/node_modules/pkg/bin/tool.js', body: 'x'.repeat(1500) },
      { name: 'gateway/lib/node_modules/.bin/tool', type: '2', link: '../pkg/bin/tool.js' },
      { name: 'gateway/current', type: '2', link: 'lib' },
      { name: 'gateway/lib/copy.js', type: '1', link: 'gateway/lib/node_modules/pkg/bin/tool.js' },
      { name: './gateway/./README', body: 'hi' },
    ];
    for (const chunk of [1, 511, 512, 513, 100_000]) {
      const s = scan(entries, {}, chunk);
      expect(s.entries).toBe(7);
      expect(s.fileBytes).toBe(1512);
      expect(s.types.get('gateway/lib/node_modules/.bin/tool')).toBe('symlink');
      expect(s.types.get('gateway/README')).toBe('file');
    }
  });

  it('long names through pax and GNU L headers', () => {
    const long = `gateway/${'d'.repeat(120)}/file`;
    const s = scan([top, paxEntry({ path: long }), { name: 'ignored', body: 'a' }, tarEntry({ name: '././@LongLink', type: 'L', body: `${long}2\0` }), { name: 'x', body: 'b' }]);
    expect([...s.types.keys()]).toEqual(['gateway', long, `${long}2`]);
  });

  it('an archive GNU tar made of a release-like tree', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'gw-tarentries-'));
    try {
      await mkdir(join(dir, 'gateway/lib/node_modules/.bin'), { recursive: true });
      await writeFile(join(dir, 'gateway/install'), '#!/bin/sh\n', { mode: 0o755 });
      await writeFile(join(dir, 'gateway/lib/node_modules/a.js'), 'a');
      await symlink('../a.js', join(dir, 'gateway/lib/node_modules/.bin/a'));
      await run('tar', ['-czf', join(dir, 'r.tar.gz'), '-C', dir, 'gateway']);
      const s = await checkTarballEntries(join(dir, 'r.tar.gz'));
      expect(s.types.get('gateway/lib/node_modules/.bin/a')).toBe('symlink');
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('hostile entries are refused', () => {
  it.each([
    ['a name with ..', [{ name: 'gateway/../../etc/cron.d/x', body: 'x' }], /"gateway\/..\/..\/etc\/cron.d\/x" climbs out with ".."/],
    ['a bare ..', [{ name: '../x', body: 'x' }], /climbs out/],
    ['an absolute name', [{ name: '/etc/passwd', body: 'x' }], /"\/etc\/passwd" is an absolute path/],
    ['a pax path with ..', [paxEntry({ path: 'gateway/../../x' }), { name: 'gateway/ok', body: 'x' }], /climbs out/],
    ['a GNU long name that is absolute', [tarEntry({ name: '././@LongLink', type: 'L', body: '/root/.ssh/authorized_keys\0' }), { name: 'gateway/ok', body: 'x' }], /absolute path/],
    ['a symlink to an absolute path', [{ name: 'gateway/etc', type: '2', link: '/etc' }], /points to the absolute path "\/etc"/],
    ['a symlink out with ..', [{ name: 'gateway/up', type: '2', link: '../../..' }], /points to "..\/..\/..", outside the archive/],
    ['a chain of links inside that ends outside', [{ name: 'gateway/a', type: '2', link: '.' }, { name: 'gateway/b', type: '2', link: 'a/../..' }], /"gateway\/b" points to "a\/..\/..", outside/],
    ['a link through another link out', [{ name: 'gateway/a', type: '2', link: '..' }, { name: 'gateway/b', type: '2', link: 'a/..' }], /outside the archive/],
    ['a loop of links', [{ name: 'gateway/a', type: '2', link: 'b' }, { name: 'gateway/b', type: '2', link: 'a' }], /loop/],
    ['a file written through a link', [{ name: 'gateway/d', type: '2', link: 'x' }, { name: 'gateway/d/f', body: 'x' }], /written through the symbolic link "gateway\/d"/],
    ['a link replacing a directory already written', [{ name: 'gateway/d/f', body: 'x' }, { name: 'gateway/d', type: '2', link: 'x' }], /"gateway\/d" appears twice/],
    ['the same name twice', [{ name: 'gateway/f', body: 'x' }, { name: 'gateway/f', type: '2', link: 'y' }], /appears twice/],
    ['a hard link to something outside', [{ name: 'gateway/h', type: '1', link: '/etc/shadow' }], /hard link "gateway\/h" to "\/etc\/shadow" is an absolute path/],
    ['a hard link to no earlier file', [{ name: 'gateway/h', type: '1', link: 'gateway/later' }, { name: 'gateway/later', body: 'x' }], /not a file met earlier/],
    ['a character device', [{ name: 'gateway/null', type: '3' }], /"gateway\/null" is a character device/],
    ['a FIFO', [{ name: 'gateway/p', type: '6' }], /is a FIFO/],
    ['a sparse file', [{ name: 'gateway/s', type: 'S' }], /entry type "S"/],
    ['a setuid file', [{ name: 'gateway/su', mode: 0o4755, body: 'x' }], /setuid or setgid \(mode 4755\)/],
  ] as Array<[string, Array<RawEntry | Buffer>, RegExp]>)('%s', (_what, entries, message) => {
    expect(refused(() => scan([top, ...entries]))).toMatch(message);
  });

  it('more entries than the limit, more bytes than the limit, an oversized long name', () => {
    const many = Array.from({ length: 11 }, (_, i): RawEntry => ({ name: `gateway/f${i}`, body: '' }));
    expect(refused(() => scan([top, ...many], { maxEntries: 10 }))).toMatch(/more than 10 entries/);
    expect(refused(() => scan([top, { name: 'gateway/big', body: Buffer.alloc(64 * 1024) }], { maxUnpackedBytes: 32 * 1024 }))).toMatch(/unpacks to more than 32768 bytes/);
    expect(refused(() => scan([tarEntry({ name: '././@LongLink', type: 'L', body: 'a'.repeat(5000) })], { maxMetaBytes: 4096 }))).toMatch(/long name of 5000 bytes/);
  });

  it('a damaged header, a truncated archive, an empty one', () => {
    const tar = tarOf([top, { name: 'gateway/f', body: 'x'.repeat(2000) }]);
    const bad = Buffer.from(tar);
    bad[512 + 10] = bad[512 + 10]! ^ 0x20;
    expect(refused(() => new TarScanner().push(bad))).toMatch(/header checksum is wrong/);
    const s = new TarScanner();
    s.push(tar.subarray(0, 512 + 512 + 1000));
    expect(refused(() => s.end())).toMatch(/ends in the middle of an entry \(truncated\)/);
    expect(refused(() => new TarScanner().end())).toMatch(/holds no entry/);
    expect(refused(() => scan([{ name: 'gateway/d', type: '5', size: 10 } as RawEntry]))).toMatch(/carries 10 bytes/);
  });

  it('a gzip bomb stops at the byte limit; a file that is not gzip is refused', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'gw-tarentries-'));
    try {
      // 64 MiB of zeros after one header compresses to ~64 KiB: refused as soon as gunzip passes the limit.
      const bomb = gzipSync(Buffer.concat([tarEntry({ name: 'gateway/z', body: Buffer.alloc(64 * 1024 * 1024) }), Buffer.alloc(1024)]), { level: 1 });
      expect(bomb.length).toBeLessThan(1024 * 1024);
      await writeFile(join(dir, 'bomb.tar.gz'), bomb);
      await expect(checkTarballEntries(join(dir, 'bomb.tar.gz'), { maxUnpackedBytes: 8 * 1024 * 1024 })).rejects.toMatchObject({
        code: 'GW_ERR_UPGRADE_TARBALL',
        message: expect.stringMatching(/unpacks to more than 8388608 bytes/),
      });
      await writeFile(join(dir, 'plain.tar.gz'), tarOf([top]));
      await expect(checkTarballEntries(join(dir, 'plain.tar.gz'))).rejects.toMatchObject({ code: 'GW_ERR_UPGRADE_TARBALL', message: expect.stringMatching(/is not a gzip file/) });
      await writeFile(join(dir, 'escape.tar.gz'), targz([top, { name: 'gateway/../x', body: 'x' }]));
      await expect(checkTarballEntries(join(dir, 'escape.tar.gz'))).rejects.toMatchObject({ code: 'GW_ERR_UPGRADE_TARBALL' });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('helpers', () => {
  it('nameComponents and parsePax', () => {
    expect(nameComponents('./a//b/./c/', 'x')).toEqual(['a', 'b', 'c']);
    expect(parsePax(Buffer.from('12 path=abc\n15 linkpath=de\n'))).toEqual(new Map([['path', 'abc'], ['linkpath', 'de']]));
    expect(refused(() => parsePax(Buffer.from('99 path=abc\n')))).toMatch(/pax header record is malformed/);
  });
});

