/** The SSH Service warns when its built-in sftp server could not start as a login user: the install is hidden. */
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { unreadableByOthers } from '../../src/agent/ssh.js';

const dir = mkdtempSync(join(tmpdir(), 'gw-ssh-install-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('unreadableByOthers', () => {
  it('names the first directory other users cannot enter, or the file they cannot read', () => {
    chmodSync(dir, 0o755);
    mkdirSync(join(dir, 'root-home', 'gw', 'dist'), { recursive: true });
    const program = join(dir, 'root-home', 'gw', 'dist', 'gateway.js');
    writeFileSync(program, '');
    chmodSync(program, 0o644);
    expect(unreadableByOthers(program)).toBeUndefined();
    chmodSync(join(dir, 'root-home'), 0o700); // a clone under /root
    expect(unreadableByOthers(program)).toBe(join(dir, 'root-home'));
    chmodSync(join(dir, 'root-home'), 0o711); // others may pass through without listing: enough
    expect(unreadableByOthers(program)).toBeUndefined();
    chmodSync(program, 0o600);
    expect(unreadableByOthers(program)).toBe(program);
    expect(unreadableByOthers(join(dir, 'missing', 'gateway.js'))).toBe(join(dir, 'missing'));
  });
});
