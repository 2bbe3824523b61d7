import { describe, expect, it } from 'vitest';
import { defaultDataDir, defaultWebPort, isRoot } from '../src/paths.js';

describe('per-user defaults', () => {
  it('root: /var/lib/gateway and port 443, whatever the environment says', () => {
    expect(defaultDataDir({ HOME: '/root', XDG_STATE_HOME: '/root/.state' }, true)).toBe('/var/lib/gateway');
    expect(defaultWebPort(true)).toBe(443);
  });

  it('another user: $XDG_STATE_HOME/gateway, else ~/.local/state/gateway, and port 3080', () => {
    expect(defaultDataDir({ HOME: '/home/dev', XDG_STATE_HOME: '/home/dev/.state' }, false)).toBe('/home/dev/.state/gateway');
    expect(defaultDataDir({ HOME: '/home/dev' }, false)).toBe('/home/dev/.local/state/gateway');
    expect(defaultDataDir({ HOME: '/home/dev', XDG_STATE_HOME: 'relative/state' }, false)).toBe('/home/dev/.local/state/gateway');
    expect(defaultWebPort(false)).toBe(3080);
  });

  it('who counts as root is the uid of this process', () => {
    expect(isRoot()).toBe(process.getuid?.() === 0);
  });
});
