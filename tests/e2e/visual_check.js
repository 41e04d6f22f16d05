// Text cut off by its box, and text boxes drawn over each other (tests/e2e/test_visual.py).
(() => {
  const textOf = (el) => [...el.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('').trim();
  const shown = (el) => {
    const s = getComputedStyle(el), r = el.getBoundingClientRect();
    // Visually hidden text for screen readers (1 px boxes, clipped, or off the screen) is not shown.
    const hidden = (s.clip && s.clip !== 'auto') || s.clipPath !== 'none' || r.width * r.height < 16
      || r.right <= 0 || r.left >= innerWidth || r.bottom <= 0;
    return s.visibility !== 'hidden' && s.display !== 'none' && parseFloat(s.opacity) > 0 && !hidden;
  };
  const label = (el) => `${el.tagName.toLowerCase()}[${el.getAttribute('data-testid') || el.className || ''}] "${(el.innerText || '').trim().slice(0, 60)}"`;
  const cut = [];
  for (const el of document.querySelectorAll('body *')) {
    if (!shown(el) || !(el.innerText || '').trim()) continue;
    const s = getComputedStyle(el);
    const hides = ['hidden', 'clip'].includes(s.overflowX) || s.textOverflow === 'ellipsis';
    if (hides && el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0) cut.push(label(el));
  }
  const texts = [...document.querySelectorAll('h1,h2,h3,p,label,button,a,li,[data-testid=stMetricValue],[data-testid=stMetricLabel]')]
    .filter(el => shown(el) && textOf(el) && (el.innerText || '').trim() && !el.closest('[data-testid=stSidebar]'));
  const overlaps = [];
  for (let i = 0; i < texts.length; i++) {
    for (let j = i + 1; j < texts.length; j++) {
      const a = texts[i], b = texts[j];
      if (a.contains(b) || b.contains(a)) continue;
      const r = a.getBoundingClientRect(), q = b.getBoundingClientRect();
      const w = Math.min(r.right, q.right) - Math.max(r.left, q.left);
      const h = Math.min(r.bottom, q.bottom) - Math.max(r.top, q.top);
      if (w > 3 && h > 3) overlaps.push(`${label(a)} over ${label(b)}`);
    }
  }
  return {cut, overlaps};
})
