/** watchAcrossGaps: a watcher that the backend ends with a gap hears of it and watches again from then on. */
import { describe, expect, it } from 'vitest';
import { watchAcrossGaps, type Backend, type WatchEvent } from '../../src/backend/index.js';

/** A backend whose watch() records its subscribers and can end one with an error, as PostgreSQL's does. */
function fakeBackend() {
  const subs: Array<{ prefix: string; onEvent: (e: WatchEvent) => void; onError?: (err: Error & { code: string }) => void; active: boolean }> = [];
  const backend = {
    watch(prefix: string, onEvent: (e: WatchEvent) => void, options?: { onError?: (err: Error & { code: string }) => void }) {
      const sub = { prefix, onEvent, ...(options?.onError ? { onError: options.onError } : {}), active: true };
      subs.push(sub);
      return () => void (sub.active = false);
    },
  } as unknown as Backend;
  const active = () => subs.filter((s) => s.active);
  const emit = (key: string) => active().forEach((s) => s.onEvent({ type: 'delete', key, revision: 1 }));
  const gap = () => {
    const s = active()[0]!;
    s.active = false; // the backend ends the watcher when it reports the gap
    s.onError?.(Object.assign(new Error('fell behind the change log'), { code: 'GW_ERR_BACKEND_COMPACTED' }));
  };
  return { backend, subs, active, emit, gap };
}

describe('watchAcrossGaps', () => {
  it('passes events, reports a gap, watches again after it, and stops when asked', () => {
    const f = fakeBackend();
    const seen: string[] = [];
    const gaps: string[] = [];
    const stop = watchAcrossGaps(f.backend, '/locks/', (e) => seen.push(e.type === 'delete' ? e.key : e.item.key), (err) => gaps.push(err.code));
    f.emit('/locks/a');
    f.gap();
    expect(gaps).toEqual(['GW_ERR_BACKEND_COMPACTED']);
    expect(f.active()).toHaveLength(1);
    expect(f.subs).toHaveLength(2);
    f.emit('/locks/b');
    expect(seen).toEqual(['/locks/a', '/locks/b']);
    stop();
    expect(f.active()).toHaveLength(0);
    f.emit('/locks/c');
    expect(seen).toEqual(['/locks/a', '/locks/b']);
  });
});
