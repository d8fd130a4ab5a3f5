//! The chart's readout: a help line that says how to read the page (point
//! at the chart, or `?t=SECONDS` in its address), the box under it that
//! shows the values at that time and who allocated each series, and the
//! few lines of inline JavaScript that fill it from the data embedded in
//! the page. Names reach the page only as JSON (with `<`, `>` and `&`
//! escaped) and are put in the box as text, never as markup.

use std::fmt::Write as _;

use super::{Drawn, MEM_LINES};
use crate::report::timeline::Timeline;

/// Owners named per series in the readout; the rest are counted.
const OWNERS_SHOWN: usize = 3;

/// The help line and the (until a time is chosen, waiting) readout box.
pub(super) fn help_and_readout(page: &mut String, t: &Timeline) {
    let example = t.points.last().map_or(0.0, |p| p.t_s) / 2.0;
    let _ = writeln!(
        page,
        "<p id=\"help\">Reading the chart: point at it and the box below shows, at that time, every series' bytes, who allocated them (processes of the site's sampled stacks, where the report has them) and the meminfo lines. To open the page at a time, add <code>?t=SECONDS</code> to its address (<code>?t={example:.1}</code>: {example:.1} s into the run). Every reading's exact bytes are in the table at the end.</p>\n<div id=\"readout\">No time chosen: point at the chart, or add ?t=SECONDS to the address.</div>"
    );
}

/// The values the readout shows, as JSON in the page, and the script.
pub(super) fn script(
    page: &mut String,
    t: &Timeline,
    series: &[Drawn],
    values: &[Vec<u64>],
    deltas: &[[i64; 4]],
    x: &dyn Fn(f64) -> f64,
) {
    let entries: Vec<serde_json::Value> = series
        .iter()
        .map(|s| {
            serde_json::json!({
                "name": s.label,
                "colour": s.colour.to_string(),
                "owners": s.owners.iter().take(OWNERS_SHOWN).map(|o| o.name.as_str()).collect::<Vec<_>>(),
                "more": s.owners.len().saturating_sub(OWNERS_SHOWN),
            })
        })
        .chain([serde_json::json!({
            "name": "other",
            "colour": super::palette::OTHER.to_string(),
            "owners": [],
            "more": 0,
        })])
        .collect();
    let data = serde_json::json!({
        "series": entries,
        "mem": MEM_LINES.map(|(n, _)| n),
        "points": t.points.iter().zip(values).zip(deltas).map(|((p, v), d)| serde_json::json!({
            "x": (x(p.t_s) * 10.0).round() / 10.0,
            "t": p.t_s,
            "total": p.total.bytes,
            "v": v,
            "mem": MEM_LINES.map(|(_, f)| f(&p.meminfo)),
            "d": d,
        })).collect::<Vec<_>>(),
        "triggers": t.triggers.iter().map(|m| serde_json::json!({"x": x(m.t_s), "c": m.condition})).collect::<Vec<_>>(),
    });
    let _ = writeln!(
        page,
        "<script id=\"kheap-data\" type=\"application/json\">{}</script>\n<script>{READOUT_JS}</script>",
        script_safe(&data.to_string())
    );
}

/// JSON that cannot end or change its script element: `<`, `>` and `&`
/// occur only inside its strings, where their \u escapes mean the same.
fn script_safe(json: &str) -> String {
    json.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// Shows the reading nearest the pointer in the readout; `?t=SECS` in the
/// URL shows the one nearest that time at load (a link to a moment, and a
/// test's hook).
const READOUT_JS: &str = r#"(function(){
const D=JSON.parse(document.getElementById('kheap-data').textContent);
const svg=document.getElementById('chart'),hover=document.getElementById('hover'),
cur=document.getElementById('cursor'),box=document.getElementById('readout');
function size(b){const u=['B','K','M','G','T'];let i=0,v=Math.abs(b);while(v>=1024&&i<4){v/=1024;i++;}
return (b<0?'-':'')+(i?v.toFixed(1)+u[i]:String(v)+' B');}
function nearest(key,v){let best=D.points[0];for(const p of D.points){if(Math.abs(p[key]-v)<Math.abs(best[key]-v))best=p;}return best;}
function row(cls,colour,text){const d=document.createElement('div');d.className=cls;
if(colour){const i=document.createElement('i');i.className='sw';i.style.background=colour;d.appendChild(i);}
d.appendChild(document.createTextNode(text));return d;}
function show(best){
cur.setAttribute('x1',best.x);cur.setAttribute('x2',best.x);cur.setAttribute('visibility','visible');
const rows=[row('when','',best.t.toFixed(2)+'s  total '+size(best.total)+' ('+best.total+' bytes)')];
best.v.forEach(function(b,i){if(b<=0)return;const s=D.series[i];
let by=s.owners.length?'  allocated by '+s.owners.join(', ')+(s.more?' and '+s.more+' more':''):'';
rows.push(row('series',s.colour,s.name+': '+size(b)+' ('+b+' bytes)'+by));});
D.mem.forEach(function(n,i){rows.push(row('mem','',n+': '+size(best.mem[i])+' ('+(best.d[i]>=0?'+':'')+size(best.d[i])+' since the first reading)'));});
for(const m of D.triggers){if(Math.abs(m.x-best.x)<6)rows.push(row('trigger','','trigger: '+m.c));}
box.replaceChildren.apply(box,rows);
svg.setAttribute('data-shown-t',String(best.t));}
hover.addEventListener('mousemove',function(e){
const r=svg.getBoundingClientRect(),sx=(e.clientX-r.left)*svg.viewBox.baseVal.width/r.width;
show(nearest('x',sx));});
const t=parseFloat(new URLSearchParams(location.search).get('t'));
if(!isNaN(t))show(nearest('t',t));
svg.setAttribute('data-chart-ready','1');
})();"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_json_cannot_close_or_open_markup_and_reads_back_the_same() {
        let v = serde_json::json!({"name": "</script><!--<script>a&b", "n": 1});
        let safe = script_safe(&v.to_string());
        for bad in ["<", ">", "&"] {
            assert!(!safe.contains(bad), "{safe}");
        }
        assert_eq!(serde_json::from_str::<serde_json::Value>(&safe).unwrap(), v);
    }
}
