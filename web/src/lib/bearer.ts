/**
 * The session's bearer: in memory and in sessionStorage (so a reload of the tab keeps it; a new tab or a closed
 * browser does not), never in a cookie or localStorage. Sent as Authorization: Bearer on every API call.
 */

export interface KeyValueStore {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

const KEY = 'gw_bearer';
const FORMAT = /^[A-Za-z0-9_-]{16,512}$/;

export class BearerStore {
  private value: string | undefined;
  constructor(private readonly store: KeyValueStore | undefined) {}

  get(): string | undefined {
    if (this.value !== undefined) return this.value;
    let stored: string | null = null;
    try {
      stored = this.store?.getItem(KEY) ?? null;
    } catch {
      stored = null; // storage disabled: memory only
    }
    this.value = stored && FORMAT.test(stored) ? stored : undefined;
    return this.value;
  }

  /** Keeps a bearer; one that is not base64url of a sane length is refused (never sent anywhere). */
  set(bearer: string): void {
    if (!FORMAT.test(bearer)) throw new RangeError('the server handed out a bearer that is not base64url');
    this.value = bearer;
    try {
      this.store?.setItem(KEY, bearer);
    } catch {
      // storage full or disabled: memory only
    }
  }

  clear(): void {
    this.value = undefined;
    try {
      this.store?.removeItem(KEY);
    } catch {
      // nothing kept
    }
  }
}
